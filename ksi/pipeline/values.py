"""How an archive job stores a topic's values: raw bytes, or Avro decoded into typed columns.

Before any task starts, the driver (:func:`ksi.pipeline.typed.prepare_values`) asks the Schema Registry
for every version registered under ``<topic>-value``.  With none (or no registry configured) values are
kept as raw bytes in ``kafka_value``.  With some, the table's schema is evolved to the union of all of
them (PyIceberg ``union_by_name``: Iceberg field ids, no data rewritten), so the tasks' output schema is
known up front, and each task decodes with a :class:`ValueDecoder`:

* a value framed as ``0x00 | schema id (4 bytes, big endian) | Avro body`` whose id is one of the
  subject's versions is decoded into the typed columns, ``kafka_value_schema_id`` = the id and
  ``kafka_value`` = null; but only if re-encoding the decoded row gives back the very same body
  (checked per row), so replay is always byte-identical; otherwise the raw bytes are kept;
* a value that is not framed, or framed with an id outside the subject, is kept as raw bytes;
* a framed value with a known id whose body fails to decode is a poison record: it is kept as raw
  bytes (offsets stay contiguous, replay stays exact) and also reported, with the error, to the
  dead-letter table (``_ksi_error`` column, dropped before the main write);
* a null value stays null (schema id null).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ..lake.layouts import KSI
from ..registry.client import RegistryClient, RegistryClientError
from .reader import ERROR_COLUMN, metadata_arrow_fields

__all__ = [
    "ERROR_COLUMN",
    "RegistryUnavailable",
    "ValueDecoder",
    "ValuePlan",
    "check_value_names",
    "raw_plan",
    "registry_versions",
]

MAGIC = 0


class RegistryUnavailable(RuntimeError):
    """The Schema Registry could not be asked; the message names the URL and the fix."""


@dataclass(frozen=True)
class ValuePlan:
    output_schema: pa.Schema           # what the readers emit (Arrow)
    decoder: ValueDecoder | None       # None: raw bytes only
    dead_letters: bool                 # whether output_schema carries the error column


def registry_versions(url: str, subject: str) -> dict[int, str]:
    """Schema id -> schema text of every Avro version under ``subject`` (empty if the subject does not exist)."""
    try:
        versions = RegistryClient(url).versions(subject, fresh=True)
    except RegistryClientError as exc:
        raise RegistryUnavailable(f"{exc}; check schema_registry.url, or remove it to archive values as raw"
                                  " bytes") from None
    return {version.schema_id: version.schema for version in versions if version.schema_type == "AVRO"}


def raw_plan() -> ValuePlan:
    return ValuePlan(output_schema=pa.schema(metadata_arrow_fields()), decoder=None, dead_letters=False)


class ValueDecoder:
    """Decodes a batch's values into typed columns (see the module docstring).  Pickled to executors."""

    def __init__(self, schemas: dict[int, str], value_fields: list[pa.Field]) -> None:
        self.schemas = schemas
        self.value_fields = value_fields
        self._parsed: dict[int, Any] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {"schemas": self.schemas, "value_fields": self.value_fields}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.schemas = state["schemas"]
        self.value_fields = state["value_fields"]
        self._parsed = {}

    def _schema(self, schema_id: int) -> Any:
        parsed = self._parsed.get(schema_id)
        if parsed is None:
            from ..avro import parse_schema

            parsed = self._parsed[schema_id] = parse_schema(self.schemas[schema_id])
        return parsed

    def decode(self, values: pa.Array, partitions: pa.Array, offsets: pa.Array) -> dict[str, pa.Array]:
        """Columns ``kafka_value``, ``kafka_value_schema_id``, ``_ksi_error`` and every value field."""
        from ..avro import encode_values

        n = len(values)
        raw = values.to_pylist()
        ids: list[int | None] = [None] * n
        for i, value in enumerate(raw):
            if value is not None and len(value) >= 5 and value[0] == MAGIC:
                schema_id = int.from_bytes(value[1:5], "big")
                if schema_id in self.schemas:
                    ids[i] = schema_id
        errors: list[str | None] = [None] * n
        decoded_ids: list[int | None] = [None] * n
        # per value field: row index -> value, filled per schema id group
        field_chunks: list[tuple[pa.Array, list[int]]] = []
        by_id: dict[int, list[int]] = {}
        for i, found in enumerate(ids):
            if found is not None:
                by_id.setdefault(found, []).append(i)
        for schema_id, rows in by_id.items():
            schema = self._schema(schema_id)
            good, struct = self._decode_group(schema, [raw[i][5:] for i in rows], rows, errors, schema_id)
            if struct is None:
                continue
            # verify on write: the re-encoded body must equal the original, else keep the raw bytes
            bodies = pa.array([raw[i][5:] for i in good], pa.binary())
            try:
                again = encode_values(struct, schema)
                same = pc.equal(again.cast(pa.binary()), bodies).to_pylist()
            except Exception:  # noqa: BLE001 - a body that does not re-encode is kept raw (verify on write)
                same = [False] * len(good)
            keep = [k for k, ok in enumerate(same) if ok]
            if not keep:
                continue
            kept_rows = [good[k] for k in keep]
            for i in kept_rows:
                decoded_ids[i] = schema_id
            field_chunks.append((struct.take(pa.array(keep, pa.int64())), kept_rows))
        out: dict[str, pa.Array] = {}
        decoded = [i for i, s in enumerate(decoded_ids) if s is not None]
        out["kafka_value"] = values if not decoded else pc.if_else(
            pa.array([s is not None for s in decoded_ids]), pa.nulls(n, pa.binary()), values)
        out["kafka_value_schema_id"] = pa.array(decoded_ids, pa.int32())
        out[ERROR_COLUMN] = pa.array(errors, pa.string())
        out.update(_scatter(self.value_fields, field_chunks, n))
        return out

    def _decode_group(self, schema: Any, bodies: list[bytes], rows: list[int], errors: list[str | None],
                      schema_id: int) -> tuple[list[int], pa.StructArray | None]:
        from ..avro import decode_values

        try:
            return rows, decode_values(pa.array(bodies, pa.binary()), schema)
        except Exception:  # noqa: BLE001 - some body is bad: found one by one below
            pass
        # some body in the group is bad: decode one by one to find the poison records
        good_rows, good_bodies = [], []
        for i, body in zip(rows, bodies, strict=True):
            try:
                decode_values(pa.array([body], pa.binary()), schema)
            except Exception as exc:  # noqa: BLE001 - the poison record's error goes to its row's error column
                errors[i] = f"schema id {schema_id}: {type(exc).__name__}: {exc}"[:2000]
                continue
            good_rows.append(i)
            good_bodies.append(body)
        if not good_rows:
            return [], None
        return good_rows, decode_values(pa.array(good_bodies, pa.binary()), schema)


def _scatter(value_fields: list[pa.Field], chunks: list[tuple[pa.StructArray, list[int]]],
             n: int) -> dict[str, pa.Array]:
    """Top-level value columns of ``n`` rows: each chunk's struct fields placed at its rows, null elsewhere."""
    out: dict[str, pa.Array] = {}
    for f in value_fields:
        pieces: list[pa.Array] = []
        positions: list[int] = []
        for struct, rows in chunks:
            index = struct.type.get_field_index(f.name)
            if index < 0:
                continue
            pieces.append(_conform(struct.field(index), f.type))
            positions.extend(rows)
        if not pieces:
            out[f.name] = pa.nulls(n, f.type)
            continue
        present = pa.concat_arrays(pieces)
        # indices[i] = position of row i in `present`, or null
        where: list[int | None] = [None] * n
        for k, row in enumerate(positions):
            where[row] = k
        out[f.name] = present.take(pa.array(where, pa.int64()))
    return out


def _conform(array: pa.Array, target: pa.DataType) -> pa.Array:
    """``array`` as ``target``: widened numbers, and structs whose fields were added later (nulls)."""
    if array.type == target:
        return array
    if pa.types.is_struct(target) and pa.types.is_struct(array.type):
        children = []
        for child in target:
            index = array.type.get_field_index(child.name)
            children.append(_conform(array.field(index), child.type) if index >= 0
                            else pa.nulls(len(array), child.type))
        return pa.StructArray.from_arrays(children, fields=list(target), mask=array.is_null())
    return array.cast(target)


def check_value_names(names: list[str], topic: str) -> None:
    clash = sorted(set(names) & set(KSI.metadata_roots) | ({ERROR_COLUMN} & set(names)))
    if clash:
        raise ValueError(f"topic {topic}: the value schema has fields named {', '.join(clash)}, which collide with "
                         "ksi's Kafka metadata columns; rename them in the schema, or archive the values as raw bytes "
                         "(remove schema_registry.url)")
