"""Kafka value bytes from a table's rows: stored bytes as they are, typed columns re-encoded as Avro with
Schema Registry framing (magic byte 0, 4-byte big-endian schema id, Avro body).

* A row with raw value bytes (the ksi layout's ``kafka_value``, redpanda's ``value``, ...) replays those
  bytes.  A ksi row with neither raw bytes nor a schema id is a null value (a tombstone).
* A ksi row with a writer schema id (``kafka_value_schema_id``) is encoded with that schema: the archive
  job only keeps typed columns for values whose re-encoding it checked to be byte-identical, so replay is
  what was produced.
* Foreign layouts keep no schema id: rows are encoded with the newest schema registered under
  ``<topic>-value`` that the table's columns can fill, or, if none can, with a schema derived from the
  table's columns, registered under that subject first.

Blocking (registry calls); runs in the history service's worker threads.  Encoding is column-wise
(:func:`ksi.avro.encode_values`), grouped by schema id.
"""

from __future__ import annotations

import json
import logging
import re
import struct
import threading

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..avro import (
    AvroEncodeError,
    AvroSchema,
    UnsupportedSchema,
    avro_schema_for,
    encode_values,
    parse_schema,
    unsupported_reason,
)
from ..registry.client import RegistryClient, RegistryClientError

__all__ = ["ValueEncoder", "ValuesError", "subject_for"]

log = logging.getLogger("ksi.history")


class ValuesError(Exception):
    """Values cannot be rebuilt: registry unreachable, schema unusable, columns missing."""


def subject_for(topic: str, key: bool = False) -> str:
    """Confluent's default TopicNameStrategy subject."""
    return f"{topic}-{'key' if key else 'value'}"


class ValueEncoder:
    """One topic's value rebuilding, with its parsed schemas and its foreign-layout schema choice cached."""

    def __init__(self, topic: str, table: str, registry: RegistryClient | None) -> None:
        self.topic = topic
        self.table = table
        self.registry = registry
        self._schemas: dict[int, AvroSchema] = {}
        self._foreign: dict[str, int] = {}  # the table's value type (as text) -> schema id to encode with
        self._lock = threading.Lock()

    def _where(self) -> str:
        return f"topic {self.topic} (table {self.table})"

    def _registry(self) -> RegistryClient:
        if self.registry is None:
            raise ValuesError(f"{self._where()} holds Avro-decoded values; re-encoding them needs a Schema"
                              " Registry: set [schema_registry] url")
        return self.registry

    def _schema(self, schema_id: int) -> AvroSchema:
        schema = self._schemas.get(schema_id)
        if schema is None:
            try:
                registered = self._registry().schema_by_id(schema_id)
            except RegistryClientError as exc:
                raise ValuesError(f"{self._where()}: schema id {schema_id}: {exc}") from None
            if registered.schema_type != "AVRO":
                raise ValuesError(f"{self._where()}: schema id {schema_id} is {registered.schema_type}, not AVRO")
            try:
                schema = parse_schema(registered.schema)
            except (UnsupportedSchema, ValueError) as exc:
                raise ValuesError(f"{self._where()}: schema id {schema_id}: {exc}") from None
            self._schemas[schema_id] = schema
        return schema

    def values(self, raw: pa.Array | None, schema_ids: pa.Array | None, typed: pa.StructArray | None) -> pa.Array:
        """The value bytes of each row (binary, nullable)."""
        n = len(raw if raw is not None else schema_ids if schema_ids is not None else typed)  # type: ignore[arg-type]  # one of the three is given
        out = raw.cast(pa.binary()) if raw is not None else pa.nulls(n, pa.binary())
        if typed is None or typed.type.num_fields == 0:
            return out
        stored = out.is_valid().to_numpy(zero_copy_only=False)
        if schema_ids is not None:
            ids = schema_ids.cast(pa.int64()).fill_null(-1).to_numpy(zero_copy_only=False)
            ids = np.where(stored, -1, ids)
        else:
            ids = np.where(stored, -1, self._foreign_schema_id(typed.type))
        for schema_id in np.unique(ids):
            if schema_id < 0:
                continue
            rows = np.flatnonzero(ids == schema_id)
            schema = self._schema(int(schema_id))
            try:
                bodies = encode_values(typed.take(pa.array(rows)), schema)
            except (AvroEncodeError, UnsupportedSchema) as exc:
                raise ValuesError(f"{self._where()}: cannot encode values with schema id {schema_id}: {exc}") from None
            framed = pc.binary_join_element_wise(pa.scalar(struct.pack(">bI", 0, int(schema_id)), pa.binary()),
                                                 bodies.cast(pa.binary()), pa.scalar(b"", pa.binary()))
            mask = np.zeros(n, dtype=bool)
            mask[rows] = True
            out = pc.replace_with_mask(out, pa.array(mask), framed)
        return out

    # -- foreign layouts -----------------------------------------------------------------------

    def _foreign_schema_id(self, value_type: pa.StructType) -> int:
        key = str(value_type)
        with self._lock:
            found = self._foreign.get(key)
            if found is None:
                found = self._choose_schema(value_type)
                self._foreign[key] = found
            return found

    def _choose_schema(self, value_type: pa.StructType) -> int:
        registry = self._registry()
        subject = subject_for(self.topic)
        try:
            versions = registry.versions(subject, fresh=True)
        except RegistryClientError as exc:
            raise ValuesError(f"{self._where()}: {exc}") from None
        reasons = []
        for registered in reversed(versions):
            if registered.schema_type != "AVRO":
                continue
            try:
                schema = parse_schema(registered.schema)
            except (UnsupportedSchema, ValueError) as exc:
                reasons.append(f"version {registered.version}: {exc}")
                continue
            reason = unsupported_reason(schema, value_type)
            if reason is None:
                self._schemas[registered.schema_id] = schema
                log.info("%s: values encoded with %s version %d (schema id %d)", self._where(), subject,
                         registered.version, registered.schema_id)
                return registered.schema_id
            reasons.append(f"version {registered.version}: {reason}")
        name = re.sub(r"[^A-Za-z0-9_]", "_", self.topic)
        if not name or name[0].isdigit():
            name = "_" + name
        derived = avro_schema_for(value_type, name=name, namespace="ksi.lake")
        try:
            schema_id = registry.register(subject, json.dumps(derived))
        except RegistryClientError as exc:
            raise ValuesError(f"{self._where()}: no schema under {subject} matches the table's columns"
                              f" ({'; '.join(reasons) or 'the subject has none'}), and registering one derived"
                              f" from the table failed: {exc}") from None
        log.info("%s: registered a schema derived from the table's columns under %s (schema id %d)%s", self._where(),
                 subject, schema_id, f"; registered versions did not fit: {'; '.join(reasons)}" if reasons else "")
        return schema_id
