"""Produce a few records through ksi with confluent-kafka (librdkafka).

    python examples/producer.py --topic orders --count 10

ksi passes Produce through to the real cluster untouched, so this is an ordinary Kafka producer:
the only ksi-specific thing is the bootstrap address.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from confluent_kafka import KafkaError, Message, Producer


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bootstrap", default="127.0.0.1:9192", help="ksi's listen address (default %(default)s)")
    parser.add_argument("--topic", required=True)
    parser.add_argument("--count", type=int, default=10, help="records to send (default %(default)s)")
    args = parser.parse_args()

    producer = Producer({
        "bootstrap.servers": args.bootstrap,
        "client.id": "ksi-example-producer",
        "acks": "all",
        "linger.ms": 5,
    })
    failures = 0

    def on_delivery(err: KafkaError | None, msg: Message) -> None:
        nonlocal failures
        if err is not None:
            failures += 1
            print(f"FAILED {msg.topic()}: {err}", file=sys.stderr)
        else:
            print(f"{msg.topic()}[{msg.partition()}]@{msg.offset()} key={msg.key()!r}")

    for i in range(args.count):
        key = f"order-{i}".encode()
        value = json.dumps({"id": i, "amount": round(9.99 + i, 2), "at": time.time()}).encode()
        while True:
            try:
                producer.produce(args.topic, value=value, key=key, on_delivery=on_delivery)
                break
            except BufferError:  # the local queue is full: let deliveries drain, then retry
                producer.poll(0.1)
        producer.poll(0)

    left = producer.flush(30)
    if left:
        print(f"{left} records still undelivered after 30 s", file=sys.stderr)
    return 1 if failures or left else 0


if __name__ == "__main__":
    sys.exit(main())
