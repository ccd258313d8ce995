"""A manifest's live entries, read as PyIceberg reads them, with the reader built once per manifest schema.

PyIceberg's ``ManifestFile.fetch_manifest_entry`` parses each manifest file's Avro schema, converts it to an
Iceberg schema and builds a reader tree for it before it reads an entry.  A table's manifests nearly all
share one schema (their writer's), and that per-file work was most of planning a streaming sink's table:
1,250 manifests of 4 entries took 6.0 s to read, 5.0 s of it in the Avro header's schema conversion and
``resolve_reader`` (cProfile, 10M rows in 5,000 files).  Here the schema text is the key to the Iceberg schema
and reader built for it, so each schema is worked out once per process, and the reader of the Avro header,
which PyIceberg also builds for every file (1.2 ms a manifest, a quarter of that table's 6 s of planning),
once; the entries are decoded, and their sequence numbers inherited, by PyIceberg's own code.

This uses PyIceberg's Avro reader below its public API (``AvroFile`` and ``resolve_reader``): if either is not
what this module expects, :func:`live_entries` falls back to ``fetch_manifest_entry``.

Blocking (reads the file); called from the planner's thread.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyiceberg.io import FileIO
    from pyiceberg.manifest import ManifestEntry, ManifestFile

__all__ = ["live_entries"]

log = logging.getLogger("ksi.lake")

SCHEMAS_KEPT = 64
_READERS: OrderedDict[str, tuple[Any, Any]] = OrderedDict()  # Avro schema text -> (Iceberg schema, reader)
_HEADER: list[Any] = []  # the reader of an Avro file's header, built once
_LOCK = threading.Lock()
_fallback = [False]  # PyIceberg's internals are not what this module expects: its public reader is used


def live_entries(manifest: ManifestFile, io: FileIO) -> list[ManifestEntry]:
    """The manifest's entries that are not deleted, as ``manifest.fetch_manifest_entry(io)`` returns them."""
    if not _fallback[0]:
        try:
            return _read(manifest, io)
        except (ImportError, AttributeError, TypeError) as exc:  # another PyIceberg: its own reader from now on
            _fallback[0] = True
            log.info("reading manifests with PyIceberg's own reader (%s: %s)", type(exc).__name__, exc)
    return manifest.fetch_manifest_entry(io, discard_deleted=True)


def _read(manifest: ManifestFile, io: FileIO) -> list[ManifestEntry]:
    from pyiceberg.avro.decoder import new_decoder
    from pyiceberg.avro.file import META_SCHEMA, AvroFile, AvroFileHeader
    from pyiceberg.avro.resolver import construct_reader, resolve_reader
    from pyiceberg.manifest import (
        DEFAULT_READ_VERSION,
        MANIFEST_ENTRY_SCHEMAS,
        DataFile,
        DataFileContent,
        FileFormat,
        ManifestEntry,
        ManifestEntryStatus,
        _inherit_from_manifest,
    )

    read_types: dict[int, Any] = {-1: ManifestEntry, 2: DataFile}
    read_enums: dict[int, Any] = {0: ManifestEntryStatus, 101: FileFormat, 134: DataFileContent}

    class _Manifest(AvroFile):  # type: ignore[type-arg]
        def __enter__(self) -> _Manifest:
            with self.input_file.open() as f:
                self.decoder = new_decoder(f.read())
            with _LOCK:  # PyIceberg builds the header's reader for every file (AvroFile._read_header)
                if not _HEADER:
                    _HEADER.append(construct_reader(META_SCHEMA, {-1: AvroFileHeader}))
            self.header = _HEADER[0].read(self.decoder)
            text = self.header.meta.get("avro.schema", "")
            with _LOCK:
                known = _READERS.get(text)
                if known is not None:
                    _READERS.move_to_end(text)
            if known is None:
                schema = self.header.get_schema()  # raises when the header has no schema, as PyIceberg's does
                assert self.read_schema is not None
                known = (schema, resolve_reader(schema, self.read_schema, self.read_types, self.read_enums))
                with _LOCK:
                    _READERS[text] = known
                    while len(_READERS) > SCHEMAS_KEPT:
                        _READERS.popitem(last=False)
            self.schema, self.reader = known
            return self

    with _Manifest(io.new_input(manifest.manifest_path), MANIFEST_ENTRY_SCHEMAS[DEFAULT_READ_VERSION],
                   read_types=read_types, read_enums=read_enums) as reader:
        return [_inherit_from_manifest(entry, manifest) for entry in reader
                if entry.status != ManifestEntryStatus.DELETED]
