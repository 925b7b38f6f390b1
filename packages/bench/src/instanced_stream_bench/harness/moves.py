"""What a move costs the one-producer-per-partition model (no KIP-447 in aiokafka, so
fencing needs a transactional producer per input partition: docs/architecture.md): P
producers' init_transactions side by side, as an assignment opens its units, and again on
the same ids, each fencing its predecessor; and one processor owning every partition,
restarted, its whole assignment callback timed."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from typing import Any

from aiokafka import AIOKafkaProducer
from instanced_stream.kafka import clients

from instanced_stream_bench.harness.fleet import Group, deploy, prepare_run
from instanced_stream_bench.harness.rebalances import parse_log, wait_assigned

__all__ = ["init_transactions", "processor_moves"]


async def init_transactions(bootstrap: str, partitions: int, rounds: int = 2) -> dict[str, Any]:
    """P transactional producers started side by side, as an assignment opens its units
    (`Membership._open`), `rounds` times on the same ids: every round after the first
    fences the previous one, as a partition's next owner does after a move."""
    prefix = f"churn-init-{secrets.token_hex(3)}"
    out: dict[str, Any] = {"partitions": partitions, "rounds": []}
    held: list[AIOKafkaProducer] = []
    for r in range(rounds):
        producers = [
            clients.producer(bootstrap, transactional_id=f"{prefix}.{p}") for p in range(partitions)
        ]

        async def timed(producer: AIOKafkaProducer) -> float:
            began = time.monotonic()
            await producer.start()  # init_transactions: fences the id's earlier holder
            return time.monotonic() - began

        began = time.monotonic()
        each = await asyncio.gather(*(timed(p) for p in producers))
        wall = time.monotonic() - began
        # One at a time too: what each costs alone, without the others queued with it.
        lone = []
        for p in range(min(partitions, 8)):
            solo = clients.producer(bootstrap, transactional_id=f"{prefix}.solo{r}.{p}")
            t0 = time.monotonic()
            await solo.start()
            lone.append(time.monotonic() - t0)
            await solo.stop()
        out["rounds"].append(
            {
                "fencing": r > 0,
                "wall_s": round(wall, 3),
                "per_producer_mean_s": round(sum(each) / len(each), 4),
                "per_producer_max_s": round(max(each), 4),
                "alone_mean_s": round(sum(lone) / len(lone), 4),
            }
        )
        for old in held:
            with contextlib.suppress(Exception):
                await old.stop()
        held = producers
    for old in held:
        with contextlib.suppress(Exception):
            await old.stop()
    return out


async def processor_moves(bootstrap: str, partitions: int, moves: int = 3) -> dict[str, Any]:
    """One `stream process` owning every partition, no states, restarted `moves` times:
    each start takes all of them over from the last (its producers fence the earlier
    ones). Its assignment callback is what a move costs the process, init_transactions
    for each partition's producer included."""
    async with prepare_run(None) as (workdir, sim):
        d = await deploy(bootstrap, sim, workdir, partitions)
        group = Group(d.env, d.run_dir, time.monotonic())
        for _ in range(moves):
            group.start(0)
            await wait_assigned(group, time.monotonic() + 120)
            await group.stop([0])
        callbacks = [
            a["ended"] - a["began"]
            for life in group.lives
            for a in parse_log(life.proc.log_path).assignments
            if a["ended"] is not None
        ]
    return {
        "partitions": partitions,
        "moves": moves,
        "callback_s": [round(c, 2) for c in callbacks],
    }
