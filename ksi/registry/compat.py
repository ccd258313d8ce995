"""Avro schema compatibility: can a reader schema decode what a writer schema wrote?

The rules are Avro's schema resolution (specification, "Schema Resolution"), checked the way Avro's Java
``SchemaCompatibility`` checks them, which is what Confluent's registry runs:

- records: names match (unqualified names, or the writer's full name among the reader's aliases); every
  reader field is found in the writer by name or by one of the reader field's aliases, with a compatible
  type, or has a default; writer fields the reader lacks are skipped.
- enums: names match; every writer symbol is a reader symbol, unless the reader enum has a default.
- fixed: names and sizes match. arrays and maps: item and value types are compatible.
- unions: each branch of a writer union must be readable; a reader union reads a writer type when one
  of its branches does.
- promotions: int -> long, float, double; long -> float, double; float -> double; string <-> bytes.

Logical types do not take part, as in Java. Compatibility levels then say which way(s) to check and
against which earlier versions: BACKWARD reads old data with the new schema (new = reader), FORWARD reads
new data with an old schema, FULL both; *_TRANSITIVE checks every earlier version, not only the latest.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .schema import PRIMITIVES, ParsedSchema

__all__ = [
    "DEFAULT_LEVEL",
    "LEVELS",
    "Incompatibility",
    "check_level",
    "incompatibilities",
]

LEVELS = ("NONE", "BACKWARD", "BACKWARD_TRANSITIVE", "FORWARD", "FORWARD_TRANSITIVE", "FULL", "FULL_TRANSITIVE")
DEFAULT_LEVEL = "BACKWARD"

# (reader type, writer type) pairs Avro resolves by promotion.
_PROMOTIONS = frozenset({
    ("long", "int"),
    ("float", "int"), ("float", "long"),
    ("double", "int"), ("double", "long"), ("double", "float"),
    ("string", "bytes"), ("bytes", "string"),
})
_NAMED = frozenset({"record", "enum", "fixed"})


@dataclass(frozen=True, slots=True)
class Incompatibility:
    """One reason a reader cannot read a writer. ``kind`` is Avro's ``SchemaIncompatibilityType`` name;
    ``path`` points into the reader schema (``/fields/1/type``) as Java's ``getLocation()`` does."""

    kind: str
    path: str
    detail: str  # a template over {reader} and {writer}, the roles' names in the message
    info: str

    def describe(self, reader: str = "reader", writer: str = "writer") -> str:
        # replace(), not format(): the template also holds names from the schema.
        return (self.detail.replace("{reader}", reader).replace("{writer}", writer)
                .replace("{path}", self.path or "/"))

    def message(self, reader: str = "reader", writer: str = "writer") -> str:
        """The form Confluent puts in its ``messages`` and 409 details."""
        return (f"{{errorType:'{self.kind}', description:'{self.describe(reader, writer)}', "
                f"additionalInfo:'{self.info}'}}")


def incompatibilities(reader: ParsedSchema, writer: ParsedSchema) -> list[Incompatibility]:
    """Why ``reader`` cannot decode data written with ``writer``; empty when it can. Both must be AVRO."""
    if reader.avro is None or writer.avro is None:
        raise ValueError("compatibility is only checked between AVRO schemas")
    found = _Checker(reader.names, writer.names).check(reader.avro, writer.avro, "")
    # A named pair is checked once; its problems, found where it first appeared, are reported once.
    return list(dict.fromkeys(found))


def check_level(new: ParsedSchema, previous: Sequence[tuple[int, ParsedSchema]], level: str) -> list[str]:
    """Confluent's messages for why ``new`` may not follow ``previous`` (``(version, schema)``, oldest first)
    under ``level``; empty when it may.

    Versions are checked newest first and the first incompatible one is reported, as Confluent does.
    AVRO is checked; JSON and PROTOBUF are opaque here and pass, unless the schema type changes.
    """
    if level == "NONE" or not previous:
        return []
    against = previous if level.endswith("_TRANSITIVE") else previous[-1:]
    backward = level.startswith(("BACKWARD", "FULL"))
    forward = level.startswith(("FORWARD", "FULL"))
    for version, old in reversed(against):
        if old.schema_type != new.schema_type:
            found = [f"{{errorType:'TYPE_MISMATCH', description:'Incompatible because of different schema type: "
                     f"the old schema is {old.schema_type}, the new one {new.schema_type}', additionalInfo:''}}"]
        elif new.schema_type != "AVRO":
            continue
        else:
            found = []
            if backward:
                found += [i.message("new", "old") for i in incompatibilities(new, old)]
            if forward:
                found += [i.message("old", "new") for i in incompatibilities(old, new)]
        if found:
            return [*found, f"{{oldSchemaVersion: {version}}}", f"{{oldSchema: '{old.text}'}}",
                    f"{{compatibility: '{level}'}}"]
    return []


def _resolve(node: Any, names: Mapping[str, Any]) -> Any:
    """Follow name references and ``{"type": ...}`` wrappers down to a primitive name, a union (list) or a
    complex type's dict."""
    while True:
        if isinstance(node, str):
            if node in PRIMITIVES:
                return node
            node = names[node]
        elif isinstance(node, dict):
            kind = node["type"]
            if isinstance(kind, (dict, list)):
                node = kind
            elif kind in PRIMITIVES:
                return kind
            elif kind in ("record", "error", "enum", "fixed", "array", "map"):
                return node
            else:
                node = names[kind]
        else:
            return node


def _kind(node: Any) -> str:
    if isinstance(node, str):
        return node
    if isinstance(node, list):
        return "union"
    kind: str = node["type"]
    return "record" if kind == "error" else kind


def _short(fullname: str) -> str:
    return fullname.rpartition(".")[2]


class _Checker:
    def __init__(self, reader_names: Mapping[str, Any], writer_names: Mapping[str, Any]) -> None:
        self.reader_names = reader_names
        self.writer_names = writer_names
        # Named pairs being checked (recursive types assume success, as Java does) and already checked.
        self.in_progress: set[tuple[str, str, str]] = set()
        self.done: dict[tuple[str, str, str], list[Incompatibility]] = {}

    def check(self, reader: Any, writer: Any, path: str) -> list[Incompatibility]:
        reader = _resolve(reader, self.reader_names)
        writer = _resolve(writer, self.writer_names)
        rk, wk = _kind(reader), _kind(writer)
        if rk == wk:
            if rk in PRIMITIVES:
                return []
            if rk == "union":
                found = []
                for j, branch in enumerate(writer):
                    if self.check(reader, branch, path):
                        found.append(Incompatibility(
                            "MISSING_UNION_BRANCH", f"{path}/{j}",
                            "The {reader} schema is missing a type inside a union field at path '{path}' in the "
                            f"{{writer}} schema ({_label(_resolve(branch, self.writer_names))})",
                            f"reader union lacking writer type: {_kind(_resolve(branch, self.writer_names)).upper()}"))
                return found
            if rk == "array":
                return self.check(reader["items"], writer["items"], f"{path}/items")
            if rk == "map":
                return self.check(reader["values"], writer["values"], f"{path}/values")
            return self._named(rk, reader, writer, path)
        if wk == "union":  # every writer branch must be readable by the (non-union) reader
            return [i for j, branch in enumerate(writer) for i in self.check(reader, branch, f"{path}/{j}")]
        if (rk, wk) in _PROMOTIONS:
            return []
        if rk == "union":
            if any(not self.check(branch, writer, path) for branch in reader):
                return []
            return [Incompatibility(
                "MISSING_UNION_BRANCH", path,
                "The {reader} schema is missing a type inside a union field at path '{path}' in the {writer} "
                f"schema ({_label(writer)})", f"reader union lacking writer type: {wk.upper()}")]
        return [Incompatibility(
            "TYPE_MISMATCH", path,
            f"The type (path '{{path}}') of a field in the {{reader}} schema ({_label(reader)}) does not match "
            f"with the {{writer}} schema ({_label(writer)})",
            f"reader type: {rk.upper()} not compatible with writer type: {wk.upper()}")]

    def _named(self, kind: str, reader: dict[str, Any], writer: dict[str, Any], path: str) -> list[Incompatibility]:
        key = (kind, reader["name"], writer["name"])
        if key in self.in_progress:
            return []
        if key in self.done:
            return self.done[key]
        self.in_progress.add(key)
        try:
            found = self._name(reader, writer, path)
            if kind == "record":
                found += self._record(reader, writer, path)
            elif kind == "enum":
                missing = [s for s in writer["symbols"] if s not in reader["symbols"]]
                if missing and "default" not in reader:
                    found.append(Incompatibility(
                        "MISSING_ENUM_SYMBOLS", f"{path}/symbols",
                        "The {reader} schema is missing enum symbols '" + str(missing) + "' at path '{path}' "
                        "in the {writer} schema", ", ".join(missing)))
            elif kind == "fixed" and reader["size"] != writer["size"]:
                found.append(Incompatibility(
                    "FIXED_SIZE_MISMATCH", f"{path}/size",
                    f"The size of FIXED type field at path '{{path}}' in the {{reader}} schema ({reader['size']}) "
                    f"does not match with the {{writer}} schema ({writer['size']})",
                    f"expected: {writer['size']}, found: {reader['size']}"))
        finally:
            self.in_progress.discard(key)
        self.done[key] = found
        return found

    def _name(self, reader: dict[str, Any], writer: dict[str, Any], path: str) -> list[Incompatibility]:
        rname, wname = reader["name"], writer["name"]
        if _short(rname) == _short(wname):
            return []
        namespace = rname.rpartition(".")[0]
        aliases = [a if "." in a or not namespace else f"{namespace}.{a}" for a in reader.get("aliases") or ()]
        if wname in aliases:
            return []
        return [Incompatibility(
            "NAME_MISMATCH", f"{path}/name",
            f"The name of the schema has changed (path '{{path}}'): the {{reader}} schema names it '{rname}', "
            f"the {{writer}} schema '{wname}'", f"expected: {wname}")]

    def _record(self, reader: dict[str, Any], writer: dict[str, Any], path: str) -> list[Incompatibility]:
        writer_fields = {f["name"]: f for f in writer["fields"]}
        found: list[Incompatibility] = []
        for i, field in enumerate(reader["fields"]):
            match = writer_fields.get(field["name"])
            for alias in field.get("aliases") or ():
                if match is not None:
                    break
                match = writer_fields.get(alias)
            if match is not None:
                found += self.check(field["type"], match["type"], f"{path}/fields/{i}/type")
            elif "default" not in field:
                found.append(Incompatibility(
                    "READER_FIELD_MISSING_DEFAULT_VALUE", f"{path}/fields/{i}",
                    f"The field '{field['name']}' at path '{{path}}' in the {{reader}} schema has no default value "
                    "and is missing in the {writer} schema", field["name"]))
        return found


def _label(node: Any) -> str:
    """How a resolved type is named in messages: ``int``, ``record a.b.R``, ``union``."""
    kind = _kind(node)
    if kind in _NAMED:
        return f"{kind} {node['name']}"
    return kind
