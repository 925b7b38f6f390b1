"""Finished workflow states written straight to a state changelog, in the store's own
record format (`UnitStore.put`: the key is the instance id, the value
`InstanceState.model_dump_json()`): the churn bench's 100,000 states, written in seconds
by a plain batching producer before any processor starts."""

from __future__ import annotations

import asyncio
import random
import secrets
import time
from typing import Any

import orjson
from aiokafka import AIOKafkaProducer
from aiokafka.partitioner import DefaultPartitioner
from instanced_stream.core.state import InstanceState

__all__ = ["done_state", "same_format", "write_states"]


def done_state(instance: str, partition: int, ended_at: float, rng: random.Random) -> bytes:
    """A finished tickets workflow as the store writes it (`UnitStore.put`:
    `InstanceState.model_dump_json()`), about 3 KB: its ticket, the state its three
    turns wrote, their trace and the triggers they applied."""
    batch = [secrets.token_hex(8) for _ in range(3)]
    calls = [f"calls/{instance}/{t}/{k}" for t in range(3) for k in range(2)]
    customer = rng.choice(["acme", "globex", "initech", "umbrella", "hooli", "stark"])
    state = InstanceState(
        instance=instance,
        partition=partition,
        source={
            "topic": "items",
            "partition": partition,
            "offset": rng.randrange(10**6),
            "key": instance,
            "timestamp_ms": int(ended_at * 1000) - 9000,
        },
        input={
            "_instance": instance,
            "customer": customer,
            "subject": "Cannot log in since the last update " + "x" * rng.randint(0, 40),
            "body": (
                "Since this morning none of our agents can sign in; the page spins and "
                "then shows a timeout. We tried two browsers and cleared the cache. "
            )
            * 4,
        },
        state={
            "customer": {"name": customer, "plan": "enterprise", "vip": True},
            "urgent": {"why": "service impact"},
            "summary": "Agents cannot sign in after the update; enterprise customer, "
            "urgent, routed to the priority queue with the CRM details attached.",
        },
        turn=3,
        status="done",
        trace=[
            {
                "turn": t + 1,
                "batch_id": batch[t],
                "call_ids": calls[2 * t : 2 * t + 2],
                "note": "planned: look up the customer, assess urgency, route the ticket; "
                "the customer is on the enterprise plan",
            }
            for t in range(3)
        ],
        plan=[
            {
                "call_id": calls[2 * k],
                "tool": tool,
                "kind": "activity",
                "output": output,
                "status": "done",
                "call": {"_tool": tool, "_instance": instance, "reason": "planned"},
            }
            for k, (tool, output) in enumerate(
                [
                    ("lookupCustomer", "†state.customer"),
                    ("assessUrgency", "†state.urgent || †state.routine"),
                    ("routeTicket", None),
                ]
            )
        ],
        applied=[f"input:items/{partition}/{k}" for k in range(3)]
        + [f"result:{c}" for c in calls[:4]],
        ended={"status": "done", "reason": "routed to priority", "at": ended_at},
        owner=secrets.token_hex(3),
    )
    return state.model_dump_json().encode()


async def write_states(
    bootstrap: str, topic: str, partitions: int, count: int, prefix: str = "old-"
) -> dict[str, Any]:
    """`count` finished states on the changelog, each on the partition its instance id
    hashes to (the input's default partitioner), batched on a plain producer."""
    rng = random.Random(37)
    partitioner = DefaultPartitioner()
    every = list(range(partitions))
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        acks=1,
        linger_ms=20,
        max_batch_size=512 * 1024,
        max_request_size=8 * 1024 * 1024,
    )
    await producer.start()
    started = time.monotonic()
    written = 0
    try:
        pending: list[asyncio.Future[Any]] = []
        now = time.time()
        template: bytes | None = None
        for i in range(count):
            instance = f"{prefix}{i:07d}"
            p = partitioner(instance.encode(), every, every)
            if template is None or i % 500 == 0:
                # A fresh model every few hundred: the values vary, building 100k
                # pydantic models would cost more than the writing.
                template = done_state(instance, p, now - rng.uniform(0, 3600), rng)
                base = orjson.loads(template)
            value = dict(base, instance=instance, partition=p)
            value["input"] = dict(base["input"], _instance=instance)
            raw = orjson.dumps(value)
            written += len(raw)
            pending.append(await producer.send(topic, raw, key=instance.encode(), partition=p))
            if len(pending) >= 5000:
                await asyncio.gather(*pending)
                pending = []
        await asyncio.gather(*pending)
    finally:
        await producer.stop()
    seconds = time.monotonic() - started
    return {
        "states": count,
        "bytes": written,
        "mean_bytes": round(written / max(count, 1)),
        "seconds": round(seconds, 1),
    }


def same_format(raw: bytes) -> bool:
    """What the store would write back for a record it read: byte-identical."""
    return InstanceState.model_validate_json(raw).model_dump_json().encode() == raw
