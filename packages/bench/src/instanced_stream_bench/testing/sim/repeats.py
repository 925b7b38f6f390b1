"""Answers the simulator gave that were asked for again (`Repeats`): what a provider would
bill twice.

An instance is what the request shows of it: its rows (the input, and a later turn's
state, plan or rejected versions) without the `_instance` token, which is only its place
in the window, under the request's instructions. The same instance asked again after its
answer went out, under the same instructions, is an answer paid twice: the redo of a
crashed or moved batch that asked instead of taking its answer from the processor's
journal. A workflow's next turn shows a new state, so it is a new instance here; twins
(the same content under hidden ids) asked by two processors look alike and count too,
which a bench that reports this keeps apart by giving every item its own text.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from typing import Any

import orjson

__all__ = ["Repeats"]

# Digests kept: a bench run's items many times over; past it the oldest half goes.
_MOST = 400_000


class Repeats:
    def __init__(self, most: int = _MOST) -> None:
        self.most = most
        self._answered: dict[bytes, None] = {}  # insertion-ordered: the oldest go first

    def answered(self, system: str, items: list[dict[str, Any]]) -> int:
        """Notes the answer to `items` (a request's rows) under `system`; returns how
        many of its instances had been answered before."""
        again = 0
        for digest in _instances(system, items):
            if digest in self._answered:
                again += 1
            self._answered[digest] = None
        if len(self._answered) > self.most:
            for old in list(self._answered)[: len(self._answered) // 2]:
                del self._answered[old]
        return again


def _instances(system: str, items: list[dict[str, Any]]) -> list[bytes]:
    rows: dict[str, list[bytes]] = defaultdict(list)
    for row in items:
        token = str(row.get("_instance"))
        shown = {k: v for k, v in row.items() if k != "_instance"}
        rows[token].append(orjson.dumps(shown, option=orjson.OPT_SORT_KEYS))
    head = hashlib.blake2b(system.encode(), digest_size=16).digest()
    return [
        hashlib.blake2b(head + b"\n".join(sorted(r)), digest_size=16).digest()
        for r in rows.values()
    ]
