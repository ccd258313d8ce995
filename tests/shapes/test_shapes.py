"""The table builder: every layout x shape builds, reads back as written, and looks as the writer leaves it
(schema field by field, files, row groups, partition spec, manifest bounds, commit state, anomalies)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.transforms import DayTransform, HourTransform, IdentityTransform

from tests.shapes import anomalies as A
from tests.shapes.build import write_rows, write_table
from tests.shapes.evolution import write_redpanda_migrated
from tests.shapes.layouts import java_hashmap_order, make_layout
from tests.shapes.records import KafkaRecords, synthetic, synthetic_slices
from tests.shapes.strategies import LAYOUT_VARIANTS, layout_tables

HOURS = 6
N = 2_000


@pytest.fixture(scope="module")
def catalog(tmp_path_factory: pytest.TempPathFactory) -> SqlCatalog:
    d = tmp_path_factory.mktemp("lake")
    return SqlCatalog("lake", uri=f"sqlite:///{d}/catalog.db", warehouse=f"file://{d}/warehouse")


@pytest.fixture(scope="module")
def records() -> KafkaRecords:
    # 2,000 records over 4 partitions and 6 hours
    return synthetic(N, 4, typed=True, ms_per_record=HOURS * 3_600_000 / N, seed=7)


_names = iter(range(10**6))


def fresh(prefix: str) -> str:
    return f"t.{prefix.replace('-', '_')}_{next(_names)}"


def flat(table: pa.Table, path: str) -> pa.Array:
    top, *rest = path.split(".")
    column = table[top].combine_chunks()
    for name in rest:
        column = pc.struct_field(column, name)
    return column


def _empty_lists_as_null(value: Any) -> Any:
    # PyIceberg 0.12 reads a null list<struct> inside a struct as [] (its own writer's files too), so
    # null and empty lists are compared as equal; the files themselves keep the null (checked directly)
    if isinstance(value, dict):
        return {k: _empty_lists_as_null(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_empty_lists_as_null(v) for v in value] or None
    return value


def assert_same_rows(got: pa.Table, expected: pa.Table) -> None:
    assert got.num_rows == expected.num_rows
    norm = [repr(_empty_lists_as_null(row)) for row in got.to_pylist()]
    want = [repr(_empty_lists_as_null(row)) for row in expected.to_pylist()]
    assert sorted(norm) == sorted(want)


def data_files(table: Any) -> list[Any]:
    return [task.file for task in table.scan().plan_files()]


VARIANTS: list[tuple[str, dict[str, Any]]] = [
    ("ksi", {}), ("redpanda", {}), ("redpanda", {"mode": "schema"}), ("redpanda", {"version": "v24.3"}),
    ("automq", {}), ("automq", {"value": "typed"}), ("kafka-connect", {}),
    ("kafka-connect", {"metadata": "nested", "schemaless": True}), ("streambased", {}),
]
SHAPE_CASES = ["one-file", "streaming", "hourly", "daily", "archive", "large"]


def valid(layout: str, options: dict[str, Any], shape: str) -> bool:
    if shape == "archive":
        return layout == "ksi"
    if shape in ("hourly", "daily"):
        if layout in ("ksi", "streambased"):
            return False
        if layout == "automq" and options.get("value") != "typed":
            return False
    return True


CASES = [(layout, options, shape) for layout, options in VARIANTS for shape in SHAPE_CASES
         if valid(layout, options, shape)]


@pytest.mark.parametrize("layout,options,shape", CASES,
                         ids=[f"{lay}-{'-'.join(f'{k}={v}' for k, v in o.items()) or 'default'}-{s}"
                              for lay, o, s in CASES])
def test_layout_shape_builds_and_reads_back(catalog: SqlCatalog, records: KafkaRecords, layout: str,
                                            options: dict[str, Any], shape: str) -> None:
    source = records if layout != "ksi" else KafkaRecords(records.partition, records.offset, records.timestamp_ms,
                                                          records.key, records.value, records.headers)
    report = write_table(catalog, fresh(f"{layout}_{shape}"), source, layout=layout, shape=shape,
                         rows_per_file=200, **options)
    table = report.table
    spec_layout = make_layout(layout, source, **options)
    expected = spec_layout.to_rows(source)
    got = table.scan().to_arrow()
    assert_same_rows(got, expected)
    assert report.rows == expected.num_rows
    files = data_files(table)
    assert len(files) == report.files
    assert len(list(table.snapshots())) == report.snapshots
    # the spec the shape promises, and files that keep to it
    spec = table.spec()
    if shape in ("hourly", "daily"):
        assert len(spec.fields) == 1
        assert isinstance(spec.fields[0].transform, HourTransform if shape == "hourly" else DayTransform)
        assert table.schema().find_column_name(spec.fields[0].source_id) == spec_layout.time_path
        unit = 3_600_000 if shape == "hourly" else 86_400_000
        for f in files:
            ts = pq.read_table(f.file_path.removeprefix("file://"))
            ms = pc.divide(flat(ts, spec_layout.time_path).cast(pa.int64()), 1000)
            values = set(pc.floor(pc.divide(ms.cast(pa.float64()), unit)).to_pylist())
            assert values == {f.partition[0]}
    elif spec_layout.identity_partition:
        assert isinstance(spec.fields[0].transform, IdentityTransform)
    elif shape in ("one-file",):
        assert not spec.fields
    elif layout == "redpanda":
        assert isinstance(spec.fields[0].transform, HourTransform)  # Redpanda's default spec
    # one file per Kafka partition for per-partition writers, partitions mixed otherwise
    mixed = 0
    for f in files:
        part = flat(pq.read_table(f.file_path.removeprefix("file://")), spec_layout.partition_path)
        distinct = len(pc.unique(part))
        if spec_layout.identity_partition or (spec_layout.files_per_kafka_partition and shape != "one-file"):
            assert distinct == 1
        mixed += distinct > 1
    if not spec_layout.identity_partition and (shape == "one-file" or (
            not spec_layout.files_per_kafka_partition and shape == "streaming")):
        assert mixed > 0  # a bulk load or compaction, or a sink's file: Kafka partitions mixed
    if shape == "one-file":
        assert len(files) == (4 if spec_layout.identity_partition else 1)
    if shape in ("streaming", "large"):
        assert len(files) >= 8


def test_mix_partitions_override(catalog: SqlCatalog, records: KafkaRecords) -> None:
    # a Redpanda hour-partitioned table after a compaction: files mix Kafka partitions within an hour
    report = write_table(catalog, fresh("mixed_rp"), records, layout="redpanda", shape="hourly", mix_partitions=True)
    files = data_files(report.table)
    assert len(files) == HOURS
    assert all(len(pc.unique(flat(pq.read_table(f.file_path.removeprefix("file://")), "redpanda.partition"))) == 4
               for f in files)


def test_row_groups_as_the_writer_writes_them(catalog: SqlCatalog) -> None:
    records = synthetic(20_000, 4, seed=1)
    # Redpanda: one row group per file, one page per column chunk, no dictionary
    rp = write_table(catalog, fresh("rg_rp"), records, layout="redpanda", shape="one-file")
    (f,) = data_files(rp.table)
    md = pq.read_metadata(f.file_path.removeprefix("file://"))
    assert md.num_row_groups == 1
    column = md.row_group(0).column(0)
    assert column.compression == "ZSTD" and column.statistics is not None and column.statistics.has_min_max
    assert not column.has_dictionary_page
    # override, and Java writers' 128 MiB / ksi's 16 MiB by bytes: small data, one group
    kc = write_table(catalog, fresh("rg_kc"), synthetic(20_000, 4, typed=True), layout="kafka-connect",
                     shape="one-file", row_group_rows=3_000)
    (f,) = data_files(kc.table)
    assert pq.read_metadata(f.file_path.removeprefix("file://")).num_row_groups == 7
    assert kc.table.properties["write.parquet.row-group-size-bytes"] == str(128 << 20)
    ksi = write_table(catalog, fresh("rg_ksi"), records, layout="ksi", shape="archive", rows_per_file=5_000)
    assert ksi.table.properties["write.parquet.row-group-size-bytes"] == str(16 << 20)
    assert all(pq.read_metadata(f.file_path.removeprefix("file://")).num_row_groups == 1
               for f in data_files(ksi.table))


def _page_types(path: str, md: pq.FileMetaData) -> set[int]:
    """The page type (0: v1 data page, 2: dictionary, 3: v2 data page) of each chunk's first page."""
    from ksi.lake.thrift import decode

    data = Path(path).read_bytes()
    out = set()
    for g in range(md.num_row_groups):
        for c in range(md.num_columns):
            column = md.row_group(g).column(c)
            header, _ = decode(data, column.dictionary_page_offset if column.has_dictionary_page
                               else column.data_page_offset)
            out.add(header.get(1))
    return out


def test_pages_as_the_writer_writes_them(catalog: SqlCatalog) -> None:
    from pyiceberg.io.pyarrow import PyArrowFileIO

    from ksi.lake.pages import FilePages

    records = synthetic(50_000, 4, seed=2)
    typed = synthetic(50_000, 4, seed=2, typed=True)
    # Java writers (parquet-java under Iceberg's properties): the page index, v1 pages of at most 20,000 rows
    for name, data, layout, shape, options in (("pg_automq", records, "automq", "one-file", {"key_type": "raw"}),
                                               ("pg_kc", typed, "kafka-connect", "one-file", {}),
                                               ("pg_ksi", records, "ksi", "archive", {"rows_per_file": 50_000})):
        report = write_table(catalog, fresh(name), data, layout=layout, shape=shape, **options)
        for f in data_files(report.table):
            path = f.file_path.removeprefix("file://")
            md = pq.read_metadata(path)
            chunks = [md.row_group(g).column(c) for g in range(md.num_row_groups) for c in range(md.num_columns)]
            assert all(c.has_offset_index and c.has_column_index for c in chunks), name
            assert _page_types(path, md) <= {0, 2}, name
            pages = FilePages(PyArrowFileIO(), f.file_path, md)
            with PyArrowFileIO().new_input(f.file_path).open() as source:
                for g in range(md.num_row_groups):
                    index = pages.offset_indexes(source, g, list(enumerate(pages.footer.get(4).items[g].get(1).items)))
                    for pages_of in index.values():
                        rows = list(pages_of.first_row) + [md.row_group(g).num_rows]
                        assert int(np.diff(rows).max()) <= 20_000, name
    # Redpanda's own writer: no page index, one v2 page per column chunk, no dictionary
    rp = write_table(catalog, fresh("pg_rp"), records, layout="redpanda", shape="one-file")
    (f,) = data_files(rp.table)
    md = pq.read_metadata(f.file_path.removeprefix("file://"))
    column = md.row_group(0).column(0)
    assert not column.has_offset_index and not column.has_column_index and not column.has_dictionary_page
    assert _page_types(f.file_path.removeprefix("file://"), md) == {3}


def test_streamed_one_file_writes_row_group_by_row_group(catalog: SqlCatalog) -> None:
    report = write_table(catalog, fresh("stream_one"), synthetic_slices(50_000, 4, slice_rows=7_000),
                         layout="automq", shape="one-file", row_group_rows=10_000)
    assert report.files == 1 and report.row_groups == 5 and report.rows == 50_000
    assert report.table.scan().to_arrow().num_rows == 50_000


def _fields(schema: Any) -> list[tuple[int, str, str, bool]]:
    out = []

    def visit(field: Any, prefix: str) -> None:
        out.append((field.field_id, prefix + field.name, str(field.field_type).split("<")[0], field.required))
        t = field.field_type
        if hasattr(t, "fields"):
            for c in t.fields:
                visit(c, prefix + field.name + ".")
        elif hasattr(t, "element_field"):
            visit(t.element_field, prefix + field.name + ".")
        elif hasattr(t, "key_field"):
            visit(t.key_field, prefix + field.name + ".")
            visit(t.value_field, prefix + field.name + ".")

    for f in schema.fields:
        visit(f, "")
    return out


def test_schemas_field_by_field(records: KafkaRecords) -> None:
    # Redpanda 2026 tree, key_value mode, ids depth first as Redpanda's own catalog assigns them
    assert _fields(make_layout("redpanda", records).schema) == [
        (1, "redpanda", "struct", False), (2, "redpanda.partition", "int", False),
        (3, "redpanda.offset", "long", False), (4, "redpanda.timestamp", "timestamptz", False),
        (5, "redpanda.headers", "list", False), (6, "redpanda.headers.element", "struct", False),
        (7, "redpanda.headers.element.key", "string", False), (8, "redpanda.headers.element.value", "binary", False),
        (9, "redpanda.key", "binary", False), (10, "redpanda.timestamp_type", "int", False),
        (11, "value", "binary", False)]
    # ... and as a Java REST catalog renumbers them
    rest = make_layout("redpanda", records, catalog_type="rest").schema
    assert [(i, n) for i, n, _, _ in _fields(rest)] == [
        (1, "redpanda"), (3, "redpanda.partition"), (4, "redpanda.offset"), (5, "redpanda.timestamp"),
        (6, "redpanda.headers"), (9, "redpanda.headers.element"), (10, "redpanda.headers.element.key"),
        (11, "redpanda.headers.element.value"), (7, "redpanda.key"), (8, "redpanda.timestamp_type"), (2, "value")]
    # v24.3: required partition/offset/timestamp, timestamp without zone, binary header keys, no timestamp_type
    assert _fields(make_layout("redpanda", records, version="v24.3").schema) == [
        (1, "redpanda", "struct", True), (2, "redpanda.partition", "int", True), (3, "redpanda.offset", "long", True),
        (4, "redpanda.timestamp", "timestamp", True), (5, "redpanda.headers", "list", False),
        (6, "redpanda.headers.element", "struct", True), (7, "redpanda.headers.element.key", "binary", False),
        (8, "redpanda.headers.element.value", "binary", False), (9, "redpanda.key", "binary", False),
        (10, "value", "binary", False)]
    # schema mode: the value's fields after the struct, all optional
    schema_mode = make_layout("redpanda", records, mode="schema").schema
    assert [f.name for f in schema_mode.fields] == ["redpanda", "id", "name", "amount", "ts"]
    assert not any(f.required for f in schema_mode.fields)
    assert _fields(make_layout("automq", records).schema) == [
        (1, "_kafka_value", "binary", False), (2, "_kafka_header", "map", False),
        (5, "_kafka_header.key", "string", True),
        (6, "_kafka_header.value", "binary", True), (3, "_kafka_key", "string", False),
        (4, "_kafka_metadata", "struct", False), (7, "_kafka_metadata.partition", "int", True),
        (8, "_kafka_metadata.offset", "long", True), (9, "_kafka_metadata.timestamp", "long", True)]
    assert _fields(make_layout("kafka-connect", records).schema) == [
        (1, "id", "long", True), (2, "name", "string", False), (3, "amount", "double", False),
        (4, "ts", "timestamptz", False), (5, "_kafka_metadata_topic", "string", True),
        (6, "_kafka_metadata_partition", "int", True), (7, "_kafka_metadata_offset", "long", True),
        (8, "_kafka_metadata_timestamp", "long", False)]
    nested = make_layout("kafka-connect", records, metadata="nested").schema
    assert [n for _, n, _, _ in _fields(nested)][4:] == [
        "_kafka_metadata", "_kafka_metadata.topic", "_kafka_metadata.partition", "_kafka_metadata.offset",
        "_kafka_metadata.timestamp"]
    schemaless = make_layout("kafka-connect", records, schemaless=True).schema
    assert schemaless.find_field("_kafka_metadata_partition").field_type == make_layout(
        "automq", records).schema.find_field("_kafka_metadata.offset").field_type  # long
    assert not any(f.required for f in schemaless.fields)
    ksi = make_layout("ksi", KafkaRecords(records.partition, records.offset, records.timestamp_ms, records.key,
                                          records.value, records.headers)).schema
    assert [(i, n, r) for i, n, _, r in _fields(ksi)][:3] == [
        (1, "kafka_partition", True), (2, "kafka_offset", True), (3, "kafka_timestamp", False)]


def test_redpanda_moves_a_value_field_named_redpanda_into_the_struct(catalog: SqlCatalog) -> None:
    base = synthetic(50, 2, typed=True)
    typed = pa.StructArray.from_arrays(base.typed.flatten() + [pa.array(range(50), pa.int64())],
                                       names=[f.name for f in base.typed.type] + ["redpanda"])
    records = KafkaRecords(base.partition, base.offset, base.timestamp_ms, base.key, base.value, base.headers,
                           typed=typed)
    report = write_table(catalog, fresh("rp_data"), records, layout="redpanda", shape="one-file", mode="schema")
    schema = report.table.schema()
    assert schema.find_field("redpanda.data").field_type == make_layout("automq", records).schema.find_field(
        "_kafka_metadata.offset").field_type
    assert [f.name for f in schema.fields] == ["redpanda", "id", "name", "amount", "ts"]
    assert sorted(flat(report.table.scan().to_arrow(), "redpanda.data").to_pylist()) == list(range(50))
    # the files carry Iceberg field ids, which readers resolve columns by
    (f,) = data_files(report.table)
    arrow = pq.read_schema(f.file_path.removeprefix("file://"))
    assert arrow.field("redpanda").metadata[b"PARQUET:field_id"] == str(schema.find_field("redpanda").field_id).encode()


def test_java_hashmap_order_is_javas() -> None:
    # what java.util.HashMap printed (Java 17) for the same puts: new HashMap<>(value) + four put()s, and
    # a fresh map of the nested metadata fields
    metadata = ["_kafka_metadata_topic", "_kafka_metadata_partition", "_kafka_metadata_offset",
                "_kafka_metadata_timestamp"]
    assert java_hashmap_order(["id", "name", "amount", "ts"] + metadata, copied=4) == [
        "amount", "_kafka_metadata_topic", "_kafka_metadata_timestamp", "_kafka_metadata_offset", "name",
        "_kafka_metadata_partition", "id", "ts"]
    assert java_hashmap_order(["topic", "partition", "offset", "timestamp"], copied=0) == [
        "partition", "offset", "topic", "timestamp"]


def test_value_and_key_conventions(catalog: SqlCatalog) -> None:
    records = A.with_tombstones(synthetic(400, 2, typed=True), every=4)
    nulls = pc.sum(pc.is_null(records.value)).as_py()
    assert nulls > 0
    kv = KafkaRecords(records.partition, records.offset, records.timestamp_ms,
                      pc.if_else(pc.equal(records.partition, 0), pa.nulls(400, pa.binary()), records.key),
                      records.value, records.headers, typed=records.typed)
    # AutoMQ: a tombstone is empty bytes, a null key "", headers a map
    automq = write_table(catalog, fresh("conv_automq"), kv, layout="automq", shape="one-file").table.scan().to_arrow()
    assert automq["_kafka_value"].null_count == 0
    assert pc.sum(pc.equal(pc.binary_length(automq["_kafka_value"]), 0)).as_py() == nulls
    assert "" in automq["_kafka_key"].to_pylist()
    assert automq["_kafka_header"].to_pylist()[0] == [("h", kv.headers.to_pylist()[0][0]["value"])]
    # Redpanda key_value: tombstones kept as null values; no headers -> null headers
    no_headers = KafkaRecords(kv.partition, kv.offset, kv.timestamp_ms, kv.key, kv.value,
                              pa.array([[]] * 400, kv.headers.type))
    rp_table = write_table(catalog, fresh("conv_rp"), no_headers, layout="redpanda", shape="one-file").table
    (rp_file,) = data_files(rp_table)
    rp = pq.read_table(rp_file.file_path.removeprefix("file://"))  # PyIceberg would show [] (see above)
    assert rp["value"].null_count == nulls
    assert flat(rp, "redpanda.headers").null_count == 400
    # Kafka Connect drops tombstones: holes
    kc = write_table(catalog, fresh("conv_kc"), kv, layout="kafka-connect", shape="streaming",
                     rows_per_file=100).table.scan().to_arrow()
    assert kc.num_rows == 400 - nulls
    # Redpanda schema mode: tombstones and undecodable values go to <table>~dlq in the key_value layout
    bad = A.invalid_values(records, every=5)
    invalid = pc.sum(pc.or_(pc.is_null(bad.value), pc.is_null(bad.typed))).as_py()
    report = write_table(catalog, fresh("conv_dlq"), bad, layout="redpanda", shape="streaming", mode="schema",
                         rows_per_file=100)
    assert report.table.scan().to_arrow().num_rows == 400 - invalid
    assert report.dlq is not None and report.dlq.name()[-1].endswith("~dlq")
    dlq = report.dlq.scan().to_arrow()
    assert dlq.num_rows == invalid and "value" in dlq.column_names


def test_manifest_bounds_before_and_after_redpanda_30704(catalog: SqlCatalog) -> None:
    records = synthetic(1_000, 2, seed=3)
    old = write_table(catalog, fresh("bounds_old"), records, layout="redpanda", shape="streaming", column_bounds=False)
    new = write_table(catalog, fresh("bounds_new"), records, layout="redpanda", shape="streaming")
    offset_id = old.table.schema().find_field("redpanda.offset").field_id
    assert all(not f.lower_bounds and not f.upper_bounds for f in data_files(old.table))
    assert all(offset_id in f.lower_bounds and offset_id in f.upper_bounds for f in data_files(new.table))
    # the footers have statistics either way
    f = data_files(old.table)[0]
    assert pq.read_metadata(f.file_path.removeprefix("file://")).row_group(0).column(1).statistics.has_min_max


def test_commit_state_in_snapshot_summaries(catalog: SqlCatalog, records: KafkaRecords) -> None:
    raw = KafkaRecords(records.partition, records.offset, records.timestamp_ms, records.key, records.value,
                       records.headers)
    ksi = write_table(catalog, fresh("sum_ksi"), raw, layout="ksi", shape="archive", rows_per_file=250).table
    summary = ksi.current_snapshot().summary
    expected = raw.to_table().group_by("partition").aggregate([("offset", "max")])
    assert json.loads(summary["ksi.archived-offsets"]) == {
        str(p): o + 1
        for p, o in zip(expected["partition"].to_pylist(), expected["offset_max"].to_pylist(), strict=True)}
    assert summary["ksi.topic"] == "topic"
    kc = write_table(catalog, fresh("sum_kc"), records, layout="kafka-connect", shape="streaming",
                     rows_per_file=200).table
    snaps = list(kc.snapshots())
    assert len(snaps) > 1
    props = snaps[-1].summary.additional_properties
    assert "kafka.connect.commit-id" in props and props["kafka.connect.valid-through-ts"].endswith("Z")
    assert any(k.startswith("kafka.connect.offsets.control-iceberg.") for k in props)
    rp = write_table(catalog, fresh("sum_rp"), records, layout="redpanda", shape="streaming").table
    assert json.loads(rp.current_snapshot().summary["redpanda.commit-metadata"])["offset"] > 0
    aq = write_table(catalog, fresh("sum_aq"), records, layout="automq", shape="streaming").table
    assert "automq.commit.id" in aq.current_snapshot().summary.additional_properties
    none = write_table(catalog, fresh("sum_none"), records, layout="automq", shape="streaming", commit_state=False)
    assert "automq.commit.id" not in none.table.current_snapshot().summary.additional_properties


def test_transactions_per_writer(catalog: SqlCatalog) -> None:
    topic = A.transactional(synthetic(300, 3, typed=True), records_per_transaction=10, abort_every=3)
    aborted = pc.sum(topic.aborted).as_py()
    assert aborted > 0
    all_offsets = set(zip(topic.records.partition.to_pylist(), topic.records.offset.to_pylist(), strict=True))
    for p, markers in topic.markers.items():
        assert not any((p, m) in all_offsets for m in markers)  # markers are offsets no record has
    rp = write_table(catalog, fresh("txn_rp"), topic.as_written_by("redpanda"), layout="redpanda", shape="one-file")
    kc = write_table(catalog, fresh("txn_kc"), topic.as_written_by("kafka-connect"), layout="kafka-connect",
                     shape="one-file")
    assert rp.rows == 300 - aborted and kc.rows == 300
    holes = A.holes(topic.committed(), topic.records)
    assert sum(len(v) for v in holes.values()) == aborted


def test_compaction_and_duplicates(catalog: SqlCatalog) -> None:
    records = synthetic(500, 2, key_bytes=1, seed=5)  # 256 possible keys: many repeats
    compacted = A.compact(records)
    assert len(compacted) < 500
    assert len(pc.unique(pa.table({"p": compacted.partition, "k": compacted.key}).group_by(["p", "k"])
                         .aggregate([]).column(0))) <= len(compacted)
    dup = A.duplicate(records, 0.1, differing=True)
    table = write_table(catalog, fresh("dup"), dup, layout="automq", shape="streaming").table.scan().to_arrow()
    keys = pa.table({"p": flat(table, "_kafka_metadata.partition"), "o": flat(table, "_kafka_metadata.offset")})
    counts = keys.group_by(["p", "o"]).aggregate([("o", "count")])
    assert pc.sum(pc.greater(counts["o_count"], 1)).as_py() == 50
    # the same data file registered again in a later snapshot (apache/iceberg issue 16282)
    rereg = write_table(catalog, fresh("rereg"), synthetic(500, 2, typed=True), layout="kafka-connect",
                        shape="streaming", rows_per_file=100, reregister_files=1)
    assert rereg.table.scan().to_arrow().num_rows == 600
    paths = [f.file_path for f in data_files(rereg.table)]
    assert len(paths) == len(set(paths)) + 1


def test_redpanda_migration_v1_renames(catalog: SqlCatalog) -> None:
    records = synthetic(1_000, 2, ms_per_record=10_000, seed=11)
    report = write_redpanda_migrated(catalog, fresh("migrated"), records.slice(0, 500), records.slice(500),
                                     shape="hourly")
    table = report.table
    rows = table.scan().to_arrow()
    assert rows.num_rows == 1_000
    offsets = flat(rows, "redpanda.offset")
    ts_new, ts_old = flat(rows, "redpanda.timestamp"), flat(rows, "redpanda.timestamp_v1")
    assert pc.sum(pc.and_(pc.is_null(ts_new), pc.is_null(ts_old))).as_py() == 0
    assert ts_new.null_count == 500 and ts_old.null_count == 500
    headers = flat(rows, "redpanda.headers").to_pylist()
    old_rows = [h for h, t in zip(headers, ts_new.to_pylist(), strict=True) if t is None]
    assert all(e["key"] is None and e["key_v1"] == b"h" for hs in old_rows for e in hs)  # null header keys
    assert flat(rows, "redpanda.timestamp_type").null_count == 500
    assert len(pc.unique(offsets)) <= 1_000
    new_files = [f for f in data_files(table) if f.partition[0] is None]
    assert new_files and sum(f.record_count for f in new_files) == 500


@pytest.mark.parametrize("layout,options", LAYOUT_VARIANTS,
                         ids=[f"{lay}-{'-'.join(f'{k}={v}' for k, v in o.items()) or 'default'}"
                              for lay, o in LAYOUT_VARIANTS])
def test_hostile_tables_write_and_read_back(catalog: SqlCatalog, layout: str, options: dict[str, Any]) -> None:
    @settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(layout_tables(layout, options, max_rows=12, log_start=500))
    def check(fuzz: Any) -> None:
        report = write_rows(catalog, fresh(f"fuzz_{layout}"), fuzz.layout, fuzz.rows, files=2)
        got = report.table.scan().to_arrow()
        assert_same_rows(got, fuzz.rows)

    check()


def test_slices_make_many_files_and_manifests(tmp_path: Path) -> None:
    catalog = SqlCatalog("lake", uri=f"sqlite:///{tmp_path}/c.db", warehouse=f"file://{tmp_path}/wh")
    report = write_table(catalog, "t.large", synthetic_slices(40_000, 4, slice_rows=10_000), layout="automq",
                         shape="large", rows_per_file=1_000, files_per_commit=5)
    assert report.files == 40 and report.snapshots == 8
    manifests = report.table.current_snapshot().manifests(report.table.io)
    assert len(manifests) == 8


@pytest.mark.parametrize("layout,options", LAYOUT_VARIANTS,
                         ids=[f"{lay}-{'-'.join(f'{k}={v}' for k, v in o.items()) or 'default'}"
                              for lay, o in LAYOUT_VARIANTS])
def test_ksi_recognises_every_layout(records: KafkaRecords, layout: str, options: dict[str, Any]) -> None:
    from ksi.lake.layouts import resolve

    options = dict(options)
    typed = options.pop("typed", False) or layout != "ksi"
    source = records if typed else KafkaRecords(records.partition, records.offset, records.timestamp_ms,
                                                records.key, records.value, records.headers)
    resolved = resolve(layout, make_layout(layout, source, **options).schema, "t")
    assert resolved.partition and resolved.offset
