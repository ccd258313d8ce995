"""ksi: Kafka Service for Iceberg. A Kafka-protocol proxy that serves a topic's whole history."""

__version__ = "0.1.0"
