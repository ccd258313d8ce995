"""The lake side of history: a topic's Iceberg table, planned, indexed, read and cached.

It knows Iceberg, Parquet and Arrow, and what a Kafka record is made of (partition, offset, timestamp, key,
value, headers), but nothing of Kafka's protocol: no requests, error codes or record batches.  The Kafka
side (:mod:`ksi.history`) decides what to answer and turns records into bytes.

Modules: ``layouts`` (where each writer keeps a record's parts), ``files`` (data files read a row group
at a time, in windows), ``index`` (where each partition's offsets are), ``table`` (one table: load,
plan per snapshot, read, timestamps), ``records`` (rows -> records: nulls, duplicates, hostile rows),
``values`` (value bytes: raw, or Avro with registry framing), ``cache`` (scan resistant), ``reader``
(shared, cached, read-ahead cold reads).  Import them directly: nothing is imported eagerly, so the
pass-through proxy never loads PyIceberg.
"""
