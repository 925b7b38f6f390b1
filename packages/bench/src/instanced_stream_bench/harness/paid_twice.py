"""What a run paid the model for twice, and what the answer journal saved it
(runtime/pipeline/journal.py): `answers_paid_twice` from the simulator, which sees every
request (testing/sim/repeats.py: an instance asked again, under the same instructions,
after its answer went out), and `asks_saved` from the processors' own logs (each take
from the journal is one line). The first must be 0 for issue 55's bar; the second shows
the redos the run had."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

__all__ = ["answer_figures", "distinct"]

_TAKEN = re.compile(rb"(\d+) answers taken from the journal")


def answer_figures(
    logs: Iterable[Path], before: Mapping[str, float], after: Mapping[str, float]
) -> dict[str, int]:
    """The two figures for a run whose simulator stats were `before` and `after` it and
    whose processors wrote `logs`."""
    saved = 0
    for path in logs:
        if path.exists():
            saved += sum(int(n) for n in _TAKEN.findall(path.read_bytes()))
    twice = after.get("items_asked_again", 0) - before.get("items_asked_again", 0)
    return {"asks_saved": saved, "answers_paid_twice": int(twice)}


def distinct(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each item with a field of its own (`ref`, its id): the tickets sample draws its
    subjects and bodies from a small pool and the example hides ids from the model, so
    two tickets could be the same question to the simulator, and one answered twice
    would look like a redo paid twice. With it, `answers_paid_twice` counts redos only."""
    return [{**item, "ref": item["_instance"]} for item in items]
