"""An activity worker for the tickets example written only against librdkafka (through
confluent-kafka) and the published contract (asyncapi.yaml): it imports nothing of the
product, so it stands for a worker in Java, Go or C that reads the same document.

    python rdkafka_worker.py BOOTSTRAP PREFIX GROUP [--misroute N]

What the contract asks of it, and what it does:
- read the activity topics read_committed (the processor writes them in transactions);
- answer an awaited call (one with `_outputPath`) with a result record keyed by the
  instance id and written to partition `source.partition` of the results topic, the
  partition of the instance's input, set explicitly rather than left to the partitioner;
- for a branching output path (`a || b`), name the chosen alternative in `path`.
`--misroute N`: the first N results are also written to the next partition first, as a
client that let its partitioner choose could: the processor forwards those to the
instance's partition and applies each result once.
SIGTERM or SIGINT: stop polling, flush, commit, close.
"""

from __future__ import annotations

import argparse
import json
import re
import signal
from typing import Any

from confluent_kafka import Consumer, KafkaException, Message, Producer

TOOLS = ["lookupCustomer", "assessUrgency", "routeTicket"]
VIP = {"acme", "globex", "initech"}
URGENT = re.compile(r"down|outage|cannot log in|data loss|urgent|asap", re.IGNORECASE)


def _ticket(context: list[dict[str, Any]]) -> dict[str, Any]:
    return next((m for m in context if m.get("type", "input") == "input"), {})


def answer(record: dict[str, Any]) -> tuple[Any, str | None]:
    """The handler: (value, chosen path or None)."""
    ticket = _ticket(record.get("context", []))
    paths = [p.strip() for p in record["call"].get("_outputPath", "").split("||") if p.strip()]
    if record["tool"] == "lookupCustomer":
        customer = str(ticket.get("customer", "unknown")).lower()
        plan = "enterprise" if customer in VIP else "free"
        return {"name": customer, "plan": plan, "vip": customer in VIP}, None
    text = f"{ticket.get('subject', '')} {ticket.get('body', '')}"
    urgent, routine = [*paths, "†state.urgent", "†state.routine"][:2]
    if URGENT.search(text):
        return {"why": "service impact"}, urgent
    return {"why": "no service impact"}, routine


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("bootstrap")
    parser.add_argument("prefix")
    parser.add_argument("group")
    parser.add_argument("--misroute", type=int, default=0)
    args = parser.parse_args()
    results = f"{args.prefix}stream.results"
    consumer = Consumer(
        {
            "bootstrap.servers": args.bootstrap,
            "group.id": args.group,
            "client.id": f"rdkafka-worker-{args.group}",
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    producer = Producer(
        {"bootstrap.servers": args.bootstrap, "enable.idempotence": True, "acks": "all"}
    )
    stopping = False

    def stop(signum: int, frame: Any) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    consumer.subscribe([f"{args.prefix}activity.{tool}" for tool in TOOLS])
    misroute, seen = args.misroute, set()
    partitions = len(producer.list_topics(results, timeout=10).topics[results].partitions)
    print(f"rdkafka worker up: {results} has {partitions} partitions", flush=True)
    while not stopping:
        batch: list[Message] = consumer.consume(100, timeout=0.5)
        for msg in batch:
            error = msg.error()
            if error is not None:  # partition EOF events are off by default: a real error
                print(f"consume error: {error}", flush=True)
                continue
            record = json.loads(msg.value() or b"{}")
            if "_outputPath" not in record["call"] or record["call_id"] in seen:
                continue  # fire-and-forget (routeTicket), or a redelivery
            seen.add(record["call_id"])
            value, path = answer(record)
            result = {
                "call_id": record["call_id"],
                "instance": record["instance"],
                "tool": record["tool"],
                "turn": record["turn"],
                "value": value,
                "source": record["source"],
            }
            if path is not None:
                result["path"] = path
            body = json.dumps(result).encode()
            home = int(record["source"]["partition"])
            if misroute > 0:
                misroute -= 1
                producer.produce(
                    results, body, key=record["instance"], partition=(home + 1) % partitions
                )
            producer.produce(results, body, key=record["instance"], partition=home)
        if batch:
            # At least once: the results are acknowledged before the offsets move on.
            assert producer.flush(30) == 0, "results not acknowledged"
            try:
                consumer.commit(asynchronous=False)
            except KafkaException as exc:  # nothing to commit (errors only), or a rebalance
                print(f"commit: {exc}", flush=True)
    producer.flush(30)
    consumer.close()
    print("rdkafka worker stopped", flush=True)


if __name__ == "__main__":
    main()
