"""Outcomes per input, read_committed: each turn of each workflow decided by one
batch. Not copies of one outcome (`stream audit` counts those): a call from one run and a
no-action from another are two outcomes of one input, whatever their bytes."""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

import orjson
from instanced_stream.core.wire import json_bytes
from instanced_stream.kafka.topics import read_topic
from instanced_stream.settings import Settings

__all__ = ["per_input_outcomes"]


async def per_input_outcomes(
    bootstrap: str, settings: Settings, tools: list[str]
) -> dict[str, Any]:
    """Outcomes per input, read_committed: each turn of each workflow should be decided
    by one batch. A second batch's decision of the same turn (calls, or a no-action) is
    a duplicate outcome, however many copies of each are on the topics; copies of one
    outcome (the same record written again, as at least once may) are counted apart, as
    `outcome_copies`."""
    t = settings.topics
    decisions: dict[tuple[str, object], set[str]] = defaultdict(set)
    copies: Counter[tuple[object, ...]] = Counter()
    seen: dict[tuple[str, object], list[list[object]]] = defaultdict(list)
    for topic in [*tools, t.review]:
        async for rec in read_topic(bootstrap, topic):
            value = orjson.loads(json_bytes(rec.value))
            batch = (value.get("batch") or {}).get("id", "?")
            key = (str(value.get("instance")), value.get("turn", 1))
            if not str(batch).endswith("-approved"):
                # A step held until its producers finished (or its plan approved) goes
                # out later under `<worker>-approved`: part of the decision that planned
                # it, and a second release of it would be a copy of its call_id.
                decisions[key].add(batch)
            copies[("call", value.get("call_id"))] += 1
            seen[(str(value.get("instance")), value.get("turn", 1))].append(
                [value.get("tool"), value.get("call_id"), batch, rec.partition, rec.offset]
            )
    async for rec in read_topic(bootstrap, t.no_action):
        value = orjson.loads(json_bytes(rec.value))
        batch = (value.get("batch") or {}).get("id", "?")
        # A no-action ends the workflow's turn its batch decided: the done record's
        # trace names that batch, so it joins the calls' turn (see below).
        decisions[(str(value.get("instance")), ("no_action", batch))].add(batch)
        copies[("no_action", value.get("instance"), batch)] += 1
    done: Counter[str] = Counter()
    turn_of: dict[tuple[str, str], int] = {}
    async for rec in read_topic(bootstrap, t.done):
        value = orjson.loads(json_bytes(rec.value))
        done[str(value.get("instance"))] += 1
        for entry in value.get("trace", []):
            turn_of[(str(value.get("instance")), str(entry.get("batch_id")))] = entry.get("turn")
    merged: dict[tuple[str, object], set[str]] = defaultdict(set)
    for (instance, turn), batches in decisions.items():
        if isinstance(turn, tuple):  # a no-action: to its turn when the trace knows it
            found = turn_of.get((instance, turn[1]))
            turn = found if found is not None else turn
        merged[(instance, turn)] |= batches
    twice = [key for key, b in merged.items() if len(b) > 1]
    return {
        "duplicate_outcomes": sum(len(b) - 1 for b in merged.values()),
        "duplicate_examples": [
            {"instance": i, "turn": str(turn), "records": seen.get((i, turn), [])}
            for i, turn in twice[:5]
        ],
        "inputs_decided_twice": len({i for (i, _), b in merged.items() if len(b) > 1}),
        "outcome_copies": sum(n - 1 for n in copies.values()),
        "duplicate_done": sum(n - 1 for n in done.values()),
        "workflows_ended": len(done),
    }
