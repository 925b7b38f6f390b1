"""`stream bench --duplicates SHARE`: what answering duplicates once saves.

Moderation traffic repeats itself (spam waves, copy-paste raids): a share of the bench's
items become copies of an earlier item's content, each under its own id. Three runs at
the largest window: the plain items, the items with duplicates as asked before
(`dedupe` off), and the same with `dedupe` on (twins in a window asked once, the answer
cache for later ones). Requests, tokens and USD per item are the simulator's counts over
every item, twins included.
"""

from __future__ import annotations

import random
from typing import Any, Protocol

from instanced_stream_bench.harness.report import Endpoint, Result
from instanced_stream_bench.harness.target import SimProcess, Target

__all__ = ["DEDUPE", "Runs", "duplicate_runs", "with_duplicates"]

# The setting the third run adds (the spec's `dedupe` section, core/dedupe.py).
DEDUPE: dict[str, Any] = {"enabled": True, "cache_ttl_s": 3600, "cache_items": 100_000}


class Runs(Protocol):
    """What the duplicate runs need of the bench (`harness/bench.py`'s `Bench`): its items,
    which they swap for a while, its endpoint, and a run of the product."""

    items: list[dict[str, str]]
    results: list[Result]

    @property
    def sim(self) -> SimProcess | None:
        """The simulator, or None for a real endpoint (`target`)."""

    @property
    def target(self) -> Target:
        """The endpoint the processors ask."""

    async def product(
        self,
        name: str,
        window: int,
        *,
        partitions: int = 4,
        in_flight: int = 16,
        model: dict[str, Any] | None = None,
    ) -> Result:
        """One run of the product over `items`, its result appended to `results`."""


def with_duplicates(
    items: list[dict[str, str]], share: float, seed: int = 5
) -> list[dict[str, str]]:
    """`items` with `share` of them (never the first) replaced by a copy of an earlier
    item's content under the replaced item's own id: the same count, the same ids."""
    rng = random.Random(seed)
    out: list[dict[str, str]] = []
    for k, item in enumerate(items):
        if k and rng.random() < share:
            twin = rng.choice(out)
            out.append({**twin, "_instance": item["_instance"]})
        else:
            out.append(item)
    return out


def _ratio(run: Result, base: Result) -> str:
    if not run.cost_per_item_usd or not base.cost_per_item_usd:
        return "USD/item: not measured"
    return f"USD/item {run.cost_per_item_usd / base.cost_per_item_usd:.2f}x"


async def duplicate_runs(
    bench: Runs, endpoint: Endpoint, window: int, share: float, partitions: int
) -> list[Result]:
    # The AIMD ceiling, as the bench's other runs: it finds the account's limit.
    in_flight = endpoint.concurrency * 2 if bench.sim else 2 * (bench.target.slots or 4)
    plain_items = bench.items
    pct = f"{share:.0%}"
    plain = await bench.product(
        f"window {window}", window, in_flight=in_flight, partitions=partitions
    )
    bench.items = with_duplicates(plain_items, share)
    try:
        asked = await bench.product(
            f"window {window}, {pct} duplicates, dedupe off",
            window,
            in_flight=in_flight,
            partitions=partitions,
        )
        deduped = await bench.product(
            f"window {window}, {pct} duplicates, dedupe on",
            window,
            in_flight=in_flight,
            partitions=partitions,
            model={"dedupe": DEDUPE},
        )
    finally:
        bench.items = plain_items
    deduped.notes.append(
        f"{_ratio(deduped, asked)} the same items without dedupe, "
        f"{_ratio(deduped, plain)} the items without duplicates"
    )
    return bench.results
