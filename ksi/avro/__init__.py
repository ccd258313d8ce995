"""Avro values as typed table columns, and back, byte for byte.

Kafka values framed for the Schema Registry (magic byte 0, a 4-byte big-endian schema id, an Avro binary
body) are archived as typed Iceberg columns, one top-level column per field of the writer's record
schema, with the writer schema id kept per row.  Replaying them means rebuilding each body from the
columns with that writer schema, exactly as the producer wrote it.  This package is that mapping, with
no I/O (schemas come in as JSON text or values):

* :mod:`~ksi.avro.schema`: parsing, and the Arrow / Iceberg types of an Avro record schema;
* :mod:`~ksi.avro.decode`: Avro bodies -> typed Arrow columns (archive side);
* :mod:`~ksi.avro.encode`: typed Arrow columns -> Avro bodies, vectorized (the cold-read hot path),
  tolerating columns widened by schema evolution;
* :mod:`~ksi.avro.derive`: an Avro schema for columns that another system wrote;
* :mod:`~ksi.avro.pieces`: the per-row byte assembly the encoder is built on.
"""

from __future__ import annotations

from .decode import decode_values
from .derive import avro_schema_for
from .encode import encode_values, unsupported_reason
from .schema import (
    AvroDecodeError,
    AvroEncodeError,
    AvroSchema,
    UnsupportedSchema,
    arrow_type,
    iceberg_struct,
    parse_schema,
)

__all__ = [
    "AvroDecodeError",
    "AvroEncodeError",
    "AvroSchema",
    "UnsupportedSchema",
    "arrow_type",
    "avro_schema_for",
    "decode_values",
    "encode_values",
    "iceberg_struct",
    "parse_schema",
    "unsupported_reason",
]
