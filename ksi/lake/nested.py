"""A nested column put together again from parts that each hold some of its leaves.

pyarrow reads a subset of a nested column's leaves as the column with only those: a struct with some of its
fields, a map as list<struct<key>> or list<struct<value>>.  :mod:`ksi.lake.pages` decodes the leaves of one
column in groups (those whose pages begin at one row) and :func:`merge` makes the column of them.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["merge", "mergeable"]


def mergeable(kind: pa.DataType) -> bool:
    """Whether :func:`merge` can put a column of this type together (no dictionaries, no unions)."""
    if pa.types.is_struct(kind):
        return all(mergeable(kind.field(i).type) for i in range(kind.num_fields))
    if pa.types.is_map(kind):
        return mergeable(kind.key_type) and mergeable(kind.item_type)
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return mergeable(kind.value_type)
    return not pa.types.is_nested(kind) and not pa.types.is_dictionary(kind)


def merge(kind: pa.DataType, parts: list[pa.Array]) -> pa.Array:
    """One column of type ``kind`` from parts that each hold some of its leaves, as pyarrow reads a subset of
    a nested column's leaves (a struct with some of its fields; a map as list<struct<key>> or
    list<struct<value>>).  Validity and list offsets are the same in every part (every leaf carries the
    definition and repetition levels above it); a list's offsets that differ mean broken input: raised."""
    first = parts[0]
    if len(parts) == 1 and first.type.equals(kind, check_metadata=True):
        return first
    mask = first.is_null() if first.null_count else None
    if pa.types.is_struct(kind):
        children = []
        for i in range(kind.num_fields):
            field = kind.field(i)
            found = [p.field(field.name) for p in parts if p.type.get_field_index(field.name) >= 0]
            if not found:
                raise ValueError(f"no part holds field {field.name!r} of {kind}")
            children.append(merge(field.type, found))
        return pa.StructArray.from_arrays(children, fields=[kind.field(i) for i in range(kind.num_fields)], mask=mask)
    if pa.types.is_map(kind) or pa.types.is_list(kind) or pa.types.is_large_list(kind):
        offsets: pa.Array | None = None
        values = []
        for part in parts:
            raw = part.offsets
            lo, hi = raw[0].as_py(), raw[-1].as_py()
            rebased = pc.subtract(raw, raw[0])  # a new array: pyarrow takes no sliced offsets with a mask
            if offsets is None:
                offsets = rebased
            elif not offsets.equals(rebased):
                raise ValueError(f"parts of a {kind} column disagree on its lists")
            values.append(part.values.slice(lo, hi - lo))
        assert offsets is not None
        if pa.types.is_map(kind):
            entries = merge(pa.struct([kind.key_field, kind.item_field]), values)
            return pa.MapArray.from_arrays(offsets, entries.field(0), entries.field(1), type=kind, mask=mask)
        array_type = pa.LargeListArray if pa.types.is_large_list(kind) else pa.ListArray
        return array_type.from_arrays(offsets, merge(kind.value_type, values), type=kind, mask=mask)
    raise ValueError(f"cannot put a {kind} column together from parts {[p.type for p in parts]}")
