"""History: serving a topic's offsets below the hot watermark from its Iceberg table.

Modules: ``layouts`` (where each table layout keeps the record's parts), ``ksi_table`` (ksi's own layout
as Iceberg objects), ``lake`` (bounded reads through PyIceberg), ``service`` (shared state, threads,
caches), ``routing`` (Fetch/ListOffsets split and merge), ``topic_ids``.  Import them directly; this
package imports nothing eagerly so the pass-through proxy does not load PyIceberg.
"""
