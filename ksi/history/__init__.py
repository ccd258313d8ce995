"""History, the Kafka side: serving a topic's offsets below the hot watermark from its Iceberg table.

Modules: ``seam`` (where one partition's fetch offset is served from), ``watermarks`` (the broker's log
start and high watermark, asked on the client's connection), ``fetch`` (Fetch split at the seam, merged),
``list_offsets``, ``lake_only`` (Metadata and Produce for topics only the lake has), ``routing`` (the
handlers the filters call), ``service`` (:class:`~ksi.history.service.History`: state shared by every
connection, the lake's faults in Kafka's terms), ``chunks`` (cold records encoded as record batches),
``topic_ids``, and ``ksi_table`` (ksi's own table layout as Iceberg objects, for the pipeline).  The lake
side, which knows nothing of Kafka's protocol, is :mod:`ksi.lake`.  Import modules directly; this package
imports nothing eagerly so the pass-through proxy does not load PyIceberg.
"""
