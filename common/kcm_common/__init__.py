"""Shared building blocks: Kafka client settings used by every component."""
