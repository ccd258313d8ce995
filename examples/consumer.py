"""Replay a topic's whole history through ksi with confluent-kafka (librdkafka).

    python examples/consumer.py --topic orders

Joins a consumer group, rewinds every assigned partition to its beginning and prints each record
with its partition and offset. Through ksi "the beginning" is the first offset in the Iceberg table,
not Kafka's log-start offset: offsets below the hot watermark are served from the lake, the rest
from the cluster, as one continuous log. Stops after --idle-seconds without a record once the group
has assigned it partitions (0: never). With --registry, values in Schema Registry framing (magic byte 0,
schema id, Avro body) are printed decoded.
"""

from __future__ import annotations

import argparse
import io
import json
import struct
import sys
import time
import urllib.request
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicPartition


def avro_decoder(registry: str) -> Any:
    """Decode Schema Registry framed Avro values with the writer's schema, fetched once per id."""
    import fastavro

    schemas: dict[int, Any] = {}

    def decode(value: bytes | None) -> Any:
        if value is None or len(value) < 5 or value[0] != 0:
            return value
        (schema_id,) = struct.unpack(">I", value[1:5])
        if schema_id not in schemas:
            with urllib.request.urlopen(f"{registry.rstrip('/')}/schemas/ids/{schema_id}", timeout=10) as answer:
                schemas[schema_id] = fastavro.parse_schema(json.loads(json.loads(answer.read())["schema"]))
        return fastavro.schemaless_reader(io.BytesIO(value[5:]), schemas[schema_id])

    return decode


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bootstrap", default="127.0.0.1:9192", help="ksi's listen address (default %(default)s)")
    parser.add_argument("--topic", required=True)
    parser.add_argument("--group", default="ksi-example-replay", help="consumer group (default %(default)s)")
    parser.add_argument("--idle-seconds", type=float, default=10.0,
                        help="stop after this long without a record; 0 keeps following (default %(default)s)")
    parser.add_argument("--registry", help="Schema Registry URL: print Avro values decoded (ksi dev: http://127.0.0.1:8081)")
    args = parser.parse_args()
    decode = avro_decoder(args.registry) if args.registry else (lambda value: value)

    consumer = Consumer({
        "bootstrap.servers": args.bootstrap,
        "client.id": "ksi-example-consumer",
        "group.id": args.group,
        "auto.offset.reset": "earliest",
        "enable.auto.commit": True,
        # librdkafka's default backoff between fetches slows a replay several times over
        "fetch.queue.backoff.ms": 10,
    })

    records = 0
    last: float | None = None  # when the last record (or the assignment) arrived

    def rewind(c: Consumer, partitions: list[TopicPartition]) -> None:
        nonlocal last
        # replay from the beginning even if the group has committed offsets from an earlier run
        for tp in partitions:
            tp.offset = OFFSET_BEGINNING
        c.assign(partitions)
        last = time.monotonic()
        print(f"assigned {', '.join(f'{tp.topic}[{tp.partition}]' for tp in partitions)}", file=sys.stderr)

    consumer.subscribe([args.topic], on_assign=rewind)
    try:
        while not (args.idle_seconds and last is not None and time.monotonic() - last >= args.idle_seconds):
            msg = consumer.poll(1.0)
            if msg is None:
                continue
            if msg.error():
                raise KafkaException(msg.error())
            records += 1
            last = time.monotonic()
            _, ts = msg.timestamp()
            print(f"{msg.topic()}[{msg.partition()}]@{msg.offset()} ts={ts} key={msg.key()!r}"
                  f" value={decode(msg.value())!r}")
    except KeyboardInterrupt:
        pass
    finally:
        consumer.close()
    print(f"{records} records", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
