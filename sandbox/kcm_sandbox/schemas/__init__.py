"""Apache Kafka message schemas (JSON) that kafka-python does not ship, loaded by `kcm_sandbox.messages`."""
