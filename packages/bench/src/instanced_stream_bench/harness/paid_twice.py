"""What a run paid the model for twice, and what the answer journal saved it
(runtime/pipeline/journal.py).

- `answers_paid_twice`: instances whose answer came back, validated, more than once:
  keys (`topic/partition/offset/turn`) journaled twice under the same spec, read from the
  journal topic's history after the run (its records are compacted away only when a
  segment rolls, long after a bench). An answer a processor received but was killed
  before journaling is not seen here: nothing could have kept it.
- `items_asked_again`: from the simulator, which sees every request
  (testing/sim/repeats.py): an instance asked again under the same instructions after
  it sent the answer, whether or not the processor lived to read it (a SIGKILL while a
  request is in flight). The provider bills both; only the first is the journal's to
  save.
- `asks_saved`: the processors' own logs, one line per take from the journal.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import orjson
from instanced_stream.kafka.topics import read_topic

__all__ = ["answer_figures", "distinct", "journaled_twice"]

_TAKEN = re.compile(rb"(\d+) answers taken from the journal")


def answer_figures(
    logs: Iterable[Path], before: Mapping[str, float], after: Mapping[str, float]
) -> dict[str, int]:
    """`asks_saved` and `items_asked_again` for a run whose simulator stats were
    `before` and `after` it and whose processors wrote `logs`."""
    saved = 0
    for path in logs:
        if path.exists():
            saved += sum(int(n) for n in _TAKEN.findall(path.read_bytes()))
    again = after.get("items_asked_again", 0) - before.get("items_asked_again", 0)
    return {"asks_saved": saved, "items_asked_again": int(again)}


async def journaled_twice(bootstrap: str, topic: str) -> int:
    """Keys the journal topic holds more than one answer for under one spec edition."""
    seen: Counter[tuple[bytes, str]] = Counter()
    async for rec in read_topic(bootstrap, topic):
        if rec.key is None or not rec.value:
            continue  # a tombstone: the outcome committed
        try:
            edition = str(orjson.loads(rec.value).get("edition"))
        except (orjson.JSONDecodeError, AttributeError):
            continue
        seen[(rec.key, edition)] += 1
    return sum(1 for n in seen.values() if n > 1)


def distinct(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each item with a field of its own (`ref`, its id): the tickets sample draws its
    subjects and bodies from a small pool and the example hides ids from the model, so
    two tickets could be the same question to the simulator, and one answered twice
    would look like a redo paid twice. With it, `items_asked_again` counts redos only."""
    return [{**item, "ref": item["_instance"]} for item in items]
