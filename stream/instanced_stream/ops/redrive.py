"""`stream redrive`: items behind dead letters, sent back to the input topic once the
cause is fixed (what SQS calls a redrive).

Each dead letter of an item (`scope: item`) names its input's position; the record there
is produced again to the input topic, same key and value, or, where retention removed
it, the bytes the dead letter carries (`raw_b64`). Headers say what it is: the dead
letter it re-drives and the first attempt's position, so `stream audit` counts the
re-driven record as the same input's later attempt, accounted once by its final outcome
(ops/audit.py). A dead letter already re-driven is not re-driven again (running the
command twice sends nothing twice), and one of a re-driven record is re-driven only up to
`max_redrives` times in all: an item that keeps failing stops, it does not loop.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from instanced_stream.core.wire import json_bytes
from instanced_stream.kafka import clients
from instanced_stream.kafka.topics import read_topic
from instanced_stream.settings import Topics

__all__ = [
    "REDRIVE",
    "REDRIVE_COUNT",
    "REDRIVE_OF",
    "WORTH",
    "Attempt",
    "Input",
    "Redrive",
    "attempt_of",
    "left_out",
    "plan",
    "redrive",
]

Position = tuple[str, int, int]

REDRIVE = "stream-redrive"  # the dead letter this record re-drives: topic/partition/offset
REDRIVE_OF = "stream-redrive-of"  # the input's first attempt: topic/partition/offset
REDRIVE_COUNT = "stream-redrive-count"  # how many re-drives of that input this is

# Codes whose cause can pass (docs/troubleshooting.md): the model was down, slow or
# confused. An item that is not JSON, too large or refused for its content fails the same
# way every time; re-drive those only after changing something, with --code.
WORTH = ("unanswered", "llm_error", "llm_timeout", "internal_error")


def _where(position: Position) -> bytes:
    return f"{position[0]}/{position[1]}/{position[2]}".encode()


def _position(raw: bytes) -> Position | None:
    topic, _, rest = raw.decode("utf-8", "replace").rpartition("/")
    topic, _, partition = topic.rpartition("/")
    if not topic or not partition.isdigit() or not rest.isdigit():
        return None
    return (topic, int(partition), int(rest))


@dataclass(frozen=True, slots=True)
class Attempt:
    """What an input record's headers say of it: the first attempt it repeats (None: it
    is one), how many re-drives it is, and the dead letter it re-drives."""

    root: Position | None = None
    count: int = 0
    letter: Position | None = None


def attempt_of(headers: Iterable[tuple[str, bytes]] | None) -> Attempt:
    found = {k: v for k, v in headers or () if k in (REDRIVE, REDRIVE_OF, REDRIVE_COUNT)}
    if REDRIVE_OF not in found:
        return Attempt()
    count = found.get(REDRIVE_COUNT, b"1").decode("ascii", "replace")
    letter = _position(found[REDRIVE]) if REDRIVE in found else None
    return Attempt(_position(found[REDRIVE_OF]), int(count) if count.isdigit() else 1, letter)


@dataclass(frozen=True, slots=True)
class Input:
    key: bytes | None
    value: bytes | None
    attempt: Attempt


@dataclass(slots=True)
class Redrive:
    """One dead letter: re-driven (`skipped` None) or why not."""

    letter: Position
    code: str
    source: Position | None
    key: bytes | None = None
    value: bytes | None = None
    headers: list[tuple[str, bytes]] | None = None
    skipped: str | None = None

    def line(self) -> dict[str, Any]:
        return {
            "dead_letter": "/".join(map(str, self.letter)),
            "code": self.code,
            "source": "/".join(map(str, self.source)) if self.source else None,
            "redriven": self.skipped is None,
            **({"skipped": self.skipped} if self.skipped else {}),
        }


def left_out(
    letters: Sequence[tuple[Position, dict[str, Any]]], codes: Sequence[str]
) -> dict[str, int]:
    """The dead letters `plan` does not consider, counted by why: a call's dead letter
    (its item was answered otherwise), or an item's of a code not asked for."""
    found: dict[str, int] = {}
    for _, letter in letters:
        code = str(letter.get("code"))
        if letter.get("scope") != "item":
            why = "call"
        elif code not in codes:
            why = code
        else:
            continue
        found[why] = found.get(why, 0) + 1
    return dict(sorted(found.items()))


def plan(
    letters: Sequence[tuple[Position, dict[str, Any]]],
    inputs: dict[Position, Input],
    codes: Sequence[str],
    max_redrives: int = 1,
) -> list[Redrive]:
    """What to send for each item dead letter of `codes` (pure): `inputs` is the input
    topic as it is now, re-drives sent before included."""
    done = {i.attempt.letter for i in inputs.values() if i.attempt.letter is not None}
    out: list[Redrive] = []
    sources: set[Position | None] = set()
    for where, letter in letters:
        code = str(letter.get("code"))
        if letter.get("scope") != "item" or code not in codes:
            continue
        src = letter.get("source") or {}
        source = (str(src["topic"]), int(src["partition"]), int(src["offset"])) if src else None
        item = Redrive(where, code, source)
        out.append(item)
        if where in done:
            item.skipped = "re-driven before"
            continue
        if source is not None and source in sources:
            item.skipped = "another dead letter of the same item is re-driven"
            continue
        sources.add(source)
        found = inputs.get(source) if source else None
        attempt = found.attempt if found else Attempt()
        if attempt.count >= max_redrives:
            item.skipped = f"a re-drive that failed again ({attempt.count} of {max_redrives})"
            continue
        if found is not None:
            item.key, item.value = found.key, found.value
        elif letter.get("raw_b64") and (letter.get("raw_size") or 0) <= 65_536:
            # Retention removed the input: the dead letter carries its bytes (whole).
            item.value = base64.b64decode(letter["raw_b64"])
            item.key = (letter.get("instance") or "").encode() or None
        else:
            item.skipped = "its input is gone and the dead letter does not carry it"
            continue
        root = attempt.root or source
        assert root is not None  # found or carried: the letter named its source
        item.headers = [
            (REDRIVE, _where(where)),
            (REDRIVE_OF, _where(root)),
            (REDRIVE_COUNT, str(attempt.count + 1).encode()),
        ]
    return out


async def redrive(
    bootstrap: str,
    topics: Topics,
    codes: Sequence[str] = WORTH,
    since: tuple[str, int] | None = None,
    dry_run: bool = False,
    max_redrives: int = 1,
) -> tuple[list[Redrive], dict[str, int]]:
    """Plans the re-drives of the dead letters (from `since`: ("time", epoch ms) or
    ("offset", n) on the dead-letter topic) and, unless `dry_run`, sends them; returns
    them with the dead letters left out (`left_out`)."""
    inputs: dict[Position, Input] = {}
    async for rec in read_topic(bootstrap, topics.input):
        attempt = attempt_of([(k, bytes(v)) for k, v in rec.headers or ()])
        inputs[(topics.input, rec.partition, rec.offset)] = Input(rec.key, rec.value, attempt)
    since_ms = since[1] if since and since[0] == "time" else None
    since_offset = since[1] if since and since[0] == "offset" else None
    letters: list[tuple[Position, dict[str, Any]]] = []
    async for rec in read_topic(bootstrap, topics.dead_letter, since_ms, since_offset):
        where = (topics.dead_letter, rec.partition, rec.offset)
        letters.append((where, orjson.loads(json_bytes(rec.value))))
    planned = plan(letters, inputs, codes, max_redrives)
    others = left_out(letters, codes)
    todo = [p for p in planned if p.skipped is None]
    if dry_run or not todo:
        return planned, others
    producer = clients.producer(bootstrap)
    await producer.start()
    try:
        sent = [
            await producer.send(topics.input, p.value, key=p.key, headers=p.headers) for p in todo
        ]
        for fut in sent:
            await fut
    finally:
        await producer.stop()
    return planned, others
