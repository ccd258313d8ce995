"""Keep unknown tagged fields when re-encoding a decoded message.

kafka-python 3.0's codec decodes tagged fields it does not know into ``item.unknown_tags``
(``{"_<tag>": raw bytes}``) but its encoder writes only the fields it knows, so a proxy that rewrites
a Metadata response would silently drop fields a newer broker added.  This wraps
``TaggedFields.encode_into`` (used by both the compiled and the generic encoders) to write the unknown
ones back, raw, in ascending tag order as the protocol requires.  Applied once, when this module is
imported: by every module of ``protocol`` that uses the codec, and by the first use of a name of the
``protocol`` package; a no-op for messages without unknown tags.
"""

from __future__ import annotations

from typing import Any

from kafka.protocol.schemas.fields.codecs.tagged_fields import TaggedFields

from .varint import read_uvarint, write_uvarint

__all__ = ["install"]

_original_encode_into = TaggedFields.encode_into


def _encode_into(self: TaggedFields, item: Any, out: Any, version: int | None = None) -> None:
    unknown = None if isinstance(item, dict) else getattr(item, "unknown_tags", None)
    if not unknown:
        _original_encode_into(self, item, out, version=version)
        return
    # Encode the known fields into a scratch buffer of its own, then merge both sets by tag number.  (Not
    # EncodeBufferPool's: that is one buffer per thread, the one the enclosing message is being encoded
    # into; acquiring it again resets it and the message's bytes so far are lost.)
    from kafka.protocol.schemas.fields.codecs import EncodeBuffer

    scratch = EncodeBuffer(256)
    _original_encode_into(self, item, scratch, version=version)
    known = bytes(scratch.result())
    entries: list[tuple[int, bytes]] = []
    pos = 0
    count, pos = read_uvarint(known, pos)
    for _ in range(count):
        start = pos
        tag, pos = read_uvarint(known, pos)
        size, pos = read_uvarint(known, pos)
        pos += size
        entries.append((tag, known[start:pos]))
    for name, raw in unknown.items():
        tag = int(name.lstrip("_"))
        entries.append((tag, write_uvarint(tag) + write_uvarint(len(raw)) + bytes(raw)))
    entries.sort(key=lambda e: e[0])
    payload = write_uvarint(len(entries)) + b"".join(e[1] for e in entries)
    out.ensure(len(payload))
    out.buf[out.pos:out.pos + len(payload)] = payload
    out.pos += len(payload)


def install() -> None:
    TaggedFields.encode_into = _encode_into


install()
