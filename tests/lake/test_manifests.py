"""Manifests read with the reader built once per Avro schema, and the header's once (ksi/lake/manifests.py), give
exactly PyIceberg's entries: the live data files, their sequence numbers, snapshots, partitions and column
bounds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ksi.lake import manifests
from ksi.lake.manifests import live_entries

from .tables import catalog, interleaved, write


def described(entries: list[Any]) -> list[tuple[Any, ...]]:
    return [(e.status, e.snapshot_id, e.sequence_number, e.file_sequence_number, e.data_file.file_path,
             e.data_file.record_count, e.data_file.spec_id, e.data_file.partition, e.data_file.lower_bounds,
             e.data_file.upper_bounds, e.data_file.file_format, e.data_file.content) for e in entries]


def test_entries_are_pyiceberg_s_and_each_schema_is_resolved_once(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    lake = catalog(tmp_path)
    rows = interleaved(2, 40)
    table = write(lake, "m", [rows[i:i + 10] for i in range(0, len(rows), 10)])  # 8 files, a commit each
    table.delete("redpanda.offset < 5")  # a rewrite: deleted entries and a manifest of another snapshot
    table = lake.load_table("t.m")
    manifest_files = table.current_snapshot().manifests(table.io)
    assert len(manifest_files) > 1
    from pyiceberg.avro import resolver
    from pyiceberg.manifest import DEFAULT_READ_VERSION, MANIFEST_ENTRY_SCHEMAS

    built: list[Any] = []
    headers: list[Any] = []
    resolve, construct = resolver.resolve_reader, resolver.construct_reader

    def counted(*args: Any, **kwargs: Any) -> Any:
        if args[1] is MANIFEST_ENTRY_SCHEMAS[DEFAULT_READ_VERSION]:  # a manifest's reader (not a header's)
            built.append(args[0])
        return resolve(*args, **kwargs)

    def constructed(*args: Any, **kwargs: Any) -> Any:
        headers.append(args[0])
        return construct(*args, **kwargs)

    monkeypatch.setattr(resolver, "resolve_reader", counted)
    monkeypatch.setattr(resolver, "construct_reader", constructed)
    monkeypatch.setattr(manifests, "_READERS", type(manifests._READERS)())
    monkeypatch.setattr(manifests, "_HEADER", [])
    for manifest in manifest_files:
        assert described(live_entries(manifest, table.io)) == described(
            manifest.fetch_manifest_entry(table.io, discard_deleted=True))
    assert not manifests._fallback[0]
    # a reader per Avro schema, not per file (PyIceberg's own reads above build theirs inside its module)
    assert 1 <= len(built) == len(manifests._READERS) < len(manifest_files)
    assert len(headers) == 1  # the Avro header's reader too (PyIceberg's own reads use their module's name)


def test_another_pyiceberg_falls_back_to_its_own_reader(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lake = catalog(tmp_path)
    table = write(lake, "m", [interleaved(2, 5)])
    [manifest] = table.current_snapshot().manifests(table.io)

    def incompatible(*args: Any) -> Any:
        raise AttributeError("no such thing in this PyIceberg")

    monkeypatch.setattr(manifests, "_read", incompatible)
    monkeypatch.setattr(manifests, "_fallback", [False])
    assert described(live_entries(manifest, table.io)) == described(
        manifest.fetch_manifest_entry(table.io, discard_deleted=True))
    assert manifests._fallback[0]
