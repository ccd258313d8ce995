"""Parquet's page layer as bytes, the little of it that :mod:`ksi.lake.pages` reads and writes itself.

The parquet.thrift field ids it uses (apache/parquet-format, src/main/thrift/parquet.thrift); a page header
(:func:`page_header`); whether a data page of a repeated column begins a record (its first repetition level,
:func:`starts_record`); and a page of padding rows nobody reads (:func:`padding_page`).  Everything else of a
page, pyarrow decodes.  Sans-IO.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from .thrift import I32, STRUCT, TRUE, ThriftError, TStruct, decode, encode, varint, varint_bytes

__all__ = ["Unusable", "padding_page", "page_header", "starts_record"]

# ------------------------------------------------------------------------------------------ parquet.thrift
# The field ids used here (apache/parquet-format, src/main/thrift/parquet.thrift).
FILE_ROW_GROUPS, FILE_NUM_ROWS, FILE_ENCRYPTION = 4, 3, 8                       # FileMetaData
GROUP_COLUMNS, GROUP_NUM_ROWS, GROUP_ORDINAL = 1, 3, 7                          # RowGroup
CHUNK_FILE_PATH, CHUNK_FILE_OFFSET, CHUNK_META = 1, 2, 3                        # ColumnChunk
CHUNK_INDEXES = (4, 5, 6, 7)  # offset_index_offset/_length, column_index_offset/_length
CHUNK_OFFSET_INDEX, CHUNK_OFFSET_INDEX_LENGTH, CHUNK_CRYPTO, CHUNK_ENCRYPTED_META = 4, 5, 8, 9
META_PATH, META_CODEC, META_NUM_VALUES, META_COMPRESSED = 3, 4, 5, 7            # ColumnMetaData
META_DATA_PAGE, META_DICTIONARY_PAGE, META_ENCODING_STATS = 9, 11, 13
META_DROPPED = (10, 12, 14, 15, 16, 17)  # index page, statistics, bloom filter, size and geo statistics
HEADER_TYPE, HEADER_UNCOMPRESSED, HEADER_COMPRESSED, HEADER_V1, HEADER_V2 = 1, 2, 3, 5, 8  # PageHeader
DATA_PAGE, DICTIONARY_PAGE, DATA_PAGE_V2 = 0, 2, 3
RLE = 3
DICTIONARY_ENCODINGS = (2, 8)  # PLAIN_DICTIONARY, RLE_DICTIONARY
CODECS = {0: None, 1: "snappy", 2: "gzip", 4: "brotli", 6: "zstd", 7: "lz4_raw"}
MAGIC = b"PAR1"


class Unusable(Exception):
    """Why a file's page index cannot be used for a read (the caller decodes from the row group's start)."""


def page_header(data: bytes) -> tuple[TStruct, int]:
    """A page's header and its size in bytes."""
    try:
        header, size = decode(data)
    except ThriftError as exc:
        raise Unusable(f"page header: {exc}") from None
    if not isinstance(header.get(HEADER_TYPE), int) or not isinstance(header.get(HEADER_COMPRESSED), int):
        raise Unusable("a page header without type or size")
    return header, size


def _first_level(levels: bytes, width: int) -> int:
    """The first value of RLE/bit-packed hybrid levels of ``width`` bits."""
    try:
        head, at = varint(levels)
    except ThriftError:
        raise Unusable("no repetition levels") from None
    if not head & 1 and head >> 1 == 0:
        raise Unusable("an empty run of repetition levels")
    raw = levels[at:at + (width + 7) // 8]
    if len(raw) < (width + 7) // 8:
        raise Unusable("truncated repetition levels")
    return int.from_bytes(raw, "little") & ((1 << width) - 1)


def starts_record(page: bytes, codec: int, max_repetition: int) -> bool:
    """Whether a data page (header and body) of a repeated leaf begins with repetition level 0, i.e. with a
    new record."""
    header, at = page_header(page)
    body = page[at:at + header.get(HEADER_COMPRESSED)]
    width = max_repetition.bit_length()
    kind = header.get(HEADER_TYPE)
    if kind == DATA_PAGE_V2:
        v2 = header.get(HEADER_V2)
        length = v2.get(6) if isinstance(v2, TStruct) else None
        if not isinstance(length, int) or length <= 0:
            raise Unusable("a v2 page of a repeated column without repetition levels")
        return _first_level(body[:length], width) == 0
    if kind != DATA_PAGE:
        raise Unusable(f"page type {kind} where a data page was expected")
    v1 = header.get(HEADER_V1)
    if not isinstance(v1, TStruct) or v1.get(4) != RLE:
        raise Unusable("repetition levels not RLE-encoded")
    if codec not in CODECS:
        raise Unusable(f"compression codec {codec}")
    name = CODECS[codec]
    if name is not None:
        size = header.get(HEADER_UNCOMPRESSED)
        try:
            body = pa.Codec(name).decompress(body, decompressed_size=size, asbytes=True)
        except (pa.ArrowException, ValueError, TypeError) as exc:
            raise Unusable(f"page does not decompress: {exc}") from None
    if len(body) < 4:
        raise Unusable("truncated page")
    length = int.from_bytes(body[:4], "little")
    return _first_level(body[4:4 + length], width) == 0


_PLAIN_BYTES = {"INT32": 4, "INT64": 8, "INT96": 12, "FLOAT": 4, "DOUBLE": 8, "BYTE_ARRAY": 4}


def padding_page(column: Any, rows: int, codec: int) -> bytes:
    """A v2 data page of ``rows`` rows nobody reads, cheap to decode: each null at its top (definition level
    0), or, for a required top-level column, zeros.  ``column`` is the leaf's pq ColumnSchema."""
    def run(max_level: int) -> bytes:  # one RLE run of level 0
        return varint_bytes(rows << 1) + bytes((max_level.bit_length() + 7) // 8) if max_level else b""

    repetition, definition = run(column.max_repetition_level), run(column.max_definition_level)
    values = b""
    if not column.max_definition_level:
        kind = column.physical_type
        width = _PLAIN_BYTES.get(kind) or (column.length if kind == "FIXED_LEN_BYTE_ARRAY" else 0)
        values = bytes(-(-rows // 8)) if kind == "BOOLEAN" else bytes(rows * width)
        if not values:
            raise Unusable(f"no padding for a {kind} column")
    if codec not in CODECS:
        raise Unusable(f"compression codec {codec}")
    name = CODECS[codec]
    compressed = values if name is None else pa.Codec(name).compress(values, asbytes=True)
    levels = len(repetition) + len(definition)
    header = TStruct({1: (I32, DATA_PAGE_V2), 2: (I32, levels + len(values)), 3: (I32, levels + len(compressed)),
                      8: (STRUCT, TStruct({1: (I32, rows), 2: (I32, rows if column.max_definition_level else 0),
                                           3: (I32, rows), 4: (I32, 0), 5: (I32, len(definition)),
                                           6: (I32, len(repetition)), 7: (TRUE, True)}))})
    return encode(header) + repetition + definition + compressed
