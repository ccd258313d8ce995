"""A submitted schema, parsed and validated, with the identity that decides its global id.

AVRO is parsed with fastavro (``fastavro.schema.parse_schema``), then walked once more to add the checks
Avro's Java parser makes and fastavro skips (names, duplicate fields, duplicate or nested union branches)
and to build the identity form. JSON and PROTOBUF schemas are kept as opaque text: JSON is only checked to
be JSON, PROTOBUF not at all, and neither gets compatibility checking.

Identity form. It is Avro's Parsing Canonical Form (full names, no ``namespace``, no ``doc``, PCF's key
order, no whitespace, ``{"type": "int"}`` written ``"int"``) except that PCF's [STRIP] step is not applied
to the attributes that change what a reader decodes: field defaults, aliases, ``logicalType`` with its
``precision``/``scale``, enum defaults and custom properties (``connect.name`` ...). Pure PCF would give
``"long"`` and ``{"type": "long", "logicalType": "timestamp-millis"}`` one id, so a consumer would decode
datetimes from a producer's plain longs. Whitespace, key order and ``doc`` still map to the same id.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fastavro.schema import parse_schema as fastavro_parse_schema

from .errors import RegistryError, invalid_schema

__all__ = [
    "PRIMITIVES",
    "SCHEMA_TYPES",
    "ParsedSchema",
    "SchemaReference",
    "parse",
]

SCHEMA_TYPES = ("AVRO", "JSON", "PROTOBUF")
PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
# PCF's [ORDER]; other attributes we keep follow, sorted.
_ORDER = ("name", "type", "fields", "symbols", "items", "values", "size")
_DROPPED = frozenset({"doc", "namespace"})


@dataclass(frozen=True, slots=True)
class SchemaReference:
    """A named type this schema takes from another subject's version (Confluent schema references)."""

    name: str
    subject: str
    version: int

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "subject": self.subject, "version": self.version}


@dataclass(frozen=True, slots=True)
class ParsedSchema:
    """A valid schema. Two schemas with equal ``key`` are the same schema and share one global id."""

    schema_type: str
    text: str  # what is stored and given back to clients
    identity: str  # the identity form (see the module doc); the text itself for JSON and PROTOBUF
    references: tuple[SchemaReference, ...] = ()
    # AVRO only: the fastavro-parsed tree (full names; named types after their definition are name strings)
    # and every named type it can see, its own and its references', by full name.
    avro: Any = field(default=None, compare=False, repr=False)
    names: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def key(self) -> str:
        refs = json.dumps([r.to_json() for r in self.references], separators=(",", ":"))
        return f"{self.schema_type}\n{refs}\n{self.identity}"


def parse(schema_type: str, text: str, references: Sequence[SchemaReference] = (),
          referenced_names: Mapping[str, Any] | None = None) -> ParsedSchema:
    """Parse and validate ``text``; raise ``RegistryError`` 42201 when it is not a valid schema.

    ``referenced_names`` are the named Avro types the references bring in (the store resolves them).
    """
    if schema_type not in SCHEMA_TYPES:
        raise invalid_schema(f"unknown schemaType '{schema_type}', expected one of {', '.join(SCHEMA_TYPES)}")
    if not isinstance(text, str) or not text.strip():
        raise invalid_schema("Empty schema")
    refs = tuple(references)
    if schema_type == "PROTOBUF":
        return ParsedSchema(schema_type, text, text.strip(), refs)
    try:
        raw = json.loads(text)
    except ValueError as exc:
        raise invalid_schema(f"{schema_type} schema is not JSON: {exc}") from None
    compact = json.dumps(raw, ensure_ascii=False, separators=(",", ":"))
    if schema_type == "JSON":
        if not isinstance(raw, (dict, bool)):
            raise invalid_schema("a JSON schema must be a JSON object or a boolean")
        return ParsedSchema(schema_type, compact, compact, refs)
    names: dict[str, Any] = dict(referenced_names or {})
    try:
        tree = fastavro_parse_schema(raw, named_schemas=names)
    except RegistryError:
        raise
    except Exception as exc:  # noqa: BLE001 - fastavro raises SchemaParseException, UnknownType, but also KeyError/TypeError
        raise invalid_schema(f"{type(exc).__name__}: {exc}") from None
    identity = json.dumps(_identity(tree, names), ensure_ascii=False, separators=(",", ":"))
    return ParsedSchema(schema_type, compact, identity, refs, tree, names)


def _identity(node: Any, names: Mapping[str, Any]) -> Any:
    """Validate one fastavro-parsed node and return its identity form."""
    if isinstance(node, str):
        if node in PRIMITIVES or node in names:
            return node
        raise invalid_schema(f"unknown type '{node}'")
    if isinstance(node, list):
        return _union(node, names)
    if not isinstance(node, dict):
        raise invalid_schema(f"not a schema: {node!r}")
    kind = node.get("type")
    if isinstance(kind, (dict, list)):  # {"type": {...}}: the wrapper adds nothing
        return _identity(kind, names)
    if kind in PRIMITIVES:
        extra = _extra(node)
        return {"type": kind, **extra} if extra else kind
    if kind in ("record", "error"):
        fullname = _fullname(node)
        fields = node.get("fields")
        if not isinstance(fields, list):
            raise invalid_schema(f"record '{fullname}' has no fields array")
        seen: set[str] = set()
        out_fields = []
        for f in fields:
            fname = f.get("name") if isinstance(f, dict) else None
            if not isinstance(fname, str) or not _NAME.match(fname):
                raise invalid_schema(f"record '{fullname}' has a field with an invalid name: {fname!r}")
            if fname in seen:
                raise invalid_schema(f"record '{fullname}' has two fields named '{fname}'")
            seen.add(fname)
            out_fields.append({"name": fname, "type": _identity(f["type"], names), **_extra(f)})
        return {"name": fullname, "type": kind, "fields": out_fields, **_extra(node, fullname)}
    if kind == "enum":
        fullname = _fullname(node)
        return {"name": fullname, "type": kind, "symbols": list(node["symbols"]), **_extra(node, fullname)}
    if kind == "fixed":
        fullname = _fullname(node)
        size = node.get("size")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise invalid_schema(f"fixed '{fullname}' needs a non-negative integer size, got {size!r}")
        return {"name": fullname, "type": kind, "size": size, **_extra(node, fullname)}
    if kind == "array":
        return {"type": kind, "items": _identity(node["items"], names), **_extra(node)}
    if kind == "map":
        return {"type": kind, "values": _identity(node["values"], names), **_extra(node)}
    if isinstance(kind, str) and kind in names:
        return kind
    raise invalid_schema(f"unknown type {kind!r}")


def _union(branches: list[Any], names: Mapping[str, Any]) -> list[Any]:
    seen: set[str] = set()
    out = []
    for branch in branches:
        if isinstance(branch, list):
            raise invalid_schema("a union may not immediately contain another union")
        form = _identity(branch, names)
        # Branches are told apart by type, and named types by full name (Avro spec, "Unions").
        tag = form if isinstance(form, str) else form.get("name", form["type"])
        if tag in seen:
            raise invalid_schema(f"duplicate in union: {tag}")
        seen.add(tag)
        out.append(form)
    return out


def _fullname(node: Mapping[str, Any]) -> str:
    fullname = node.get("name")
    if not isinstance(fullname, str) or not all(_NAME.match(part) for part in fullname.split(".")):
        raise invalid_schema(f"invalid name for a {node.get('type')}: {fullname!r}")
    return fullname


def _extra(node: Mapping[str, Any], fullname: str | None = None) -> dict[str, Any]:
    """The attributes beyond PCF's that are kept in the identity form, in sorted order."""
    extra = {k: node[k] for k in sorted(node) if k not in _ORDER and k not in _DROPPED and not k.startswith("__")}
    if fullname is not None and isinstance(extra.get("aliases"), list):
        # Aliases of named types are names too: qualify them with the type's namespace.
        namespace = fullname.rpartition(".")[0]
        extra["aliases"] = [a if "." in a or not namespace else f"{namespace}.{a}" for a in extra["aliases"]]
    return extra
