"""A local KIP-714 endpoint: a Kafka-protocol gateway in front of an embedded broker."""
