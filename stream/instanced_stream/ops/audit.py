"""Conservation check: every input item must end as a published call, an explicit
NoAction, a state update (a spec without a plan), or an item-level dead letter (a context
message sent to the input topic: its forwarded copy on the context topic, or a dead
letter). Reports missing, duplicated and
unexpected records.

Shipped as `stream audit` so users can run the same check against their own topics.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any, Literal

import orjson
from pydantic import BaseModel, Field

from instanced_stream.core.messages import ITEM_CODES
from instanced_stream.core.wire import json_bytes
from instanced_stream.errors import StreamError
from instanced_stream.kafka.publish import forwarded_from
from instanced_stream.kafka.topics import TopicReader
from instanced_stream.ops.redrive import attempt_of
from instanced_stream.settings import Topics

__all__ = ["AuditReport", "Since", "audit", "final_attempts", "parse_since"]

Position = tuple[str, int, int]

# Where an audit starts: an offset on every input partition, or a time (epoch ms).
Since = tuple[Literal["offset", "time"], int]

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
# Outcomes carry the processor's clock, inputs the producer's: read outcomes from a little
# earlier so a skewed clock does not hide them (earlier ones are simply ignored).
_SKEW_MS = 300_000


def parse_since(text: str) -> Since:
    """`1200` (an offset), `30m`/`2h`/`1d` (that long ago) or an ISO time (UTC if bare)."""
    text = text.strip()
    if text.isdigit():
        return ("offset", int(text))
    ago = re.fullmatch(r"(\d+)([smhd])", text)
    if ago:
        return ("time", int((time.time() - int(ago[1]) * _UNITS[ago[2]]) * 1000))
    try:
        when = datetime.fromisoformat(text)
    except ValueError as exc:
        raise StreamError(
            f"--since {text!r}: give an offset (1200), a duration (30m, 2h, 1d) or an ISO time"
        ) from exc
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return ("time", int(when.timestamp() * 1000))


class AuditReport(BaseModel):
    inputs: int
    accounted: int
    missing: list[Position] = Field(description="Input items with no outcome yet")
    duplicate_calls: int = Field(description="Activity records whose call_id was seen before")
    unexpected: int = Field(description="Outcomes whose source is not on the input topic")
    calls_by_tool: dict[str, int]
    fire_and_forget: int
    reviewed: int = Field(description="Calls the advice gate sent to the review topic")
    proposals: int = Field(0, description="Lazy-plan proposals waiting for approval")
    no_action: int
    state_updates: int = Field(
        0, description="Instances whose outcome is a state update (no plan, latent †state)"
    )
    context_forwarded: int = Field(
        0,
        description="Context messages read on the input topic and forwarded to the context "
        "topic (accept_context_input): that is their outcome",
    )
    dead_letters: dict[str, int] = Field(description="Dead letters by code (item and call)")
    item_dead_letters: int = Field(description="Items that ended in a dead letter")
    outcomes_per_input_max: int = Field(
        0,
        description="The most outcomes of one input (per turn of a workflow), read "
        "committed: each decision of it (a batch that answered it: its calls, no-action, "
        "dead letters) counts once, and so does each extra copy of one record; 1 when every "
        "input was decided once and written once",
    )
    duplicate_outcomes: int = Field(
        0, description="Outcomes beyond the first per input and turn (decisions and copies)"
    )
    redriven: int = Field(
        0,
        description="Attempts a re-drive superseded (stream redrive): their input is "
        "accounted once, by its final attempt's outcome",
    )
    instances_in_calls: list[str] = Field(default_factory=list, exclude=True)

    @property
    def unaccounted(self) -> int:
        return len(self.missing)

    def summary(self) -> str:
        """One line for people and scripts: `missing=0` is the promise kept."""
        return (
            f"inputs={self.inputs} accounted={self.accounted} missing={len(self.missing)} "
            f"duplicates={self.duplicate_calls} unexpected={self.unexpected} "
            f"dead_letters={self.item_dead_letters}"
        )


async def audit(
    bootstrap: str, topics: Topics, activity_topics: list[str], since: Since | None = None
) -> AuditReport:
    """Reads the input topic and every outcome topic (activity, review, no-action, dead
    letters) and reports which input items have no outcome. With `since`, only input
    records from there on, and outcomes from (a little before) their time."""
    # One reader for every topic: a pair of Kafka clients per audit, not per topic read
    # (audits are polled, about once a second in the tests).
    async with TopicReader(bootstrap) as reader:
        return await _audit(reader, topics, activity_topics, since)


async def _audit(
    reader: TopicReader, topics: Topics, activity_topics: list[str], since: Since | None
) -> AuditReport:
    input_topic = topics.input
    inputs: set[Position] = set()
    later: dict[Position, tuple[Position, int]] = {}  # a re-drive -> (first attempt, count)
    sent_on: dict[Position, Position] = {}  # a forwarded copy -> where it was first
    first: dict[int, int] = {}  # per input partition, the first offset audited
    oldest: int | None = None
    start_ms = since[1] if since and since[0] == "time" else None
    start_offset = since[1] if since and since[0] == "offset" else None
    async for rec in reader.read(input_topic, start_ms, start_offset):
        inputs.add((input_topic, rec.partition, rec.offset))
        attempt = attempt_of(rec.headers)
        if attempt.root is not None:
            later[(input_topic, rec.partition, rec.offset)] = (attempt.root, attempt.count)
        came_from = forwarded_from(rec.headers)
        if came_from is not None:  # sent on to its instance's partition: the copy stands for it
            sent_on[(input_topic, rec.partition, rec.offset)] = came_from
        first[rec.partition] = min(first.get(rec.partition, rec.offset), rec.offset)
        oldest = rec.timestamp if oldest is None else min(oldest, rec.timestamp)
    for copy, came_from in sent_on.items():
        root, count = later.get(came_from, (came_from, 0))
        later[copy] = (root, count + 1)
    outcomes_ms = None if since is None else (oldest or int(time.time() * 1000)) - _SKEW_MS

    async def outcomes(topic: str) -> AsyncIterator[Any]:
        async for raw in reader.read(topic, outcomes_ms):
            yield orjson.loads(json_bytes(raw.value))

    accounted: set[Position] = set()
    unexpected = 0
    calls: Counter[str] = Counter()
    letters: Counter[str] = Counter()
    seen_ids: set[str] = set()
    duplicates = fire_and_forget = no_action = item_letters = reviewed = proposals = 0
    state_updates = 0
    instances: list[str] = []
    lettered: set[tuple[object, object, object]] = set()
    # Per input and turn, its outcome records by the decision that wrote them (the batch
    # that answered it) and what they are. Exactly once means one decision per input and
    # turn, each record of it once: a call from one run and a no-action from another are
    # two outcomes, though neither record repeats the other.
    decided: dict[tuple[object, ...], Counter[tuple[object, ...]]] = {}

    def origin(rec: dict[str, Any]) -> tuple[object, object, object]:
        src = rec.get("source") or {}
        return (src.get("topic"), src.get("partition"), src.get("offset"))

    def outcome(rec: dict[str, Any], decision: object, *what: object) -> None:
        if not rec.get("source"):
            return  # no input's outcome (a call for an instance the model invented)
        key = (*origin(rec), rec.get("turn", 1))
        decided.setdefault(key, Counter())[decision, *what] += 1

    def mark(source: dict[str, object] | None) -> None:
        nonlocal unexpected
        if not source:
            return
        pos = (str(source["topic"]), int(source["partition"]), int(source["offset"]))  # type: ignore[call-overload]
        if pos[0] != input_topic:
            return
        if since is not None and pos[2] < first.get(pos[1], pos[2] + 1):
            return  # the outcome of an item before the audited range
        if pos in inputs:
            accounted.add(pos)
        else:
            unexpected += 1

    for topic in [*activity_topics, topics.review]:
        async for rec in outcomes(topic):
            batch = rec.get("batch") or {}
            # A lazy plan's approved calls carry the approval's batch: they run the
            # proposal's decision, they are not one.
            by = None if str(batch.get("id", "")).endswith("-approved") else batch.get("id")
            outcome(rec, by, "call", rec.get("call_id"))
            if rec.get("call_id") in seen_ids:
                duplicates += 1
                continue
            seen_ids.add(rec.get("call_id"))
            if topic == topics.review:
                reviewed += 1
            else:
                calls[rec.get("tool", "?")] += 1
            if "_outputPath" not in rec.get("call", {}):
                fire_and_forget += 1
            instances.append(str(rec.get("instance")))
            mark(rec.get("source"))
    async for rec in outcomes(topics.no_action):
        outcome(rec, (rec.get("batch") or {}).get("id"), "no_action", rec.get("instance"))
        no_action += 1
        mark(rec.get("source"))
    async for rec in outcomes(topics.state_updates):
        outcome(rec, (rec.get("batch") or {}).get("id"), "state_update", rec.get("instance"))
        state_updates += 1
        mark(rec.get("source"))
    async for rec in outcomes(topics.proposals):
        proposals += 1  # a lazy plan's outcome: the proposal waits for a person
        outcome(rec, (rec.get("batch") or {}).get("id"), "proposal", rec.get("proposal_id"))
        mark(rec.get("source"))
    async for rec in outcomes(topics.dead_letter):
        letters[rec.get("code", "?")] += 1
        call = rec.get("call") or {}
        # A letter from a batch is part of that batch's decision; one without (intake, an
        # activity's) is its own outcome.
        outcome(
            rec,
            rec.get("batch_id"),
            "letter",
            rec.get("code"),
            rec.get("scope"),
            orjson.dumps(call),
        )
        if rec.get("scope") == "item" and rec.get("code") in ITEM_CODES:
            # Items, not records: a batch redone after a crash repeats its dead letters.
            src = rec.get("source") or {}
            where = (src.get("topic"), src.get("partition"), src.get("offset"))
            if not src:
                item_letters += 1
            lettered.add(where)
            mark(rec.get("source"))
    # A context message read on the input topic ends as its copy on the context topic,
    # marked with where it was first (kafka/publish.py `forwarded_context`).
    forwards = 0
    async for raw in reader.read(topics.context, outcomes_ms):
        first_at = forwarded_from(raw.headers)
        if first_at is None or first_at[0] != input_topic:
            continue  # written there by ops, not forwarded
        forwards += 1
        decided.setdefault((*first_at, 1), Counter())[None, "context"] += 1
        mark({"topic": first_at[0], "partition": first_at[1], "offset": first_at[2]})
    finals, superseded = final_attempts(inputs, later)
    missing = sorted(p for p in finals if p not in accounted)
    item_letters += len({w for w in lettered if w not in superseded and None not in w})
    return AuditReport(
        inputs=len(finals),
        accounted=len(finals) - len(missing),
        missing=missing,
        redriven=len(superseded),
        duplicate_calls=duplicates,
        unexpected=unexpected,
        calls_by_tool=dict(calls),
        fire_and_forget=fire_and_forget,
        reviewed=reviewed,
        proposals=proposals,
        no_action=no_action,
        state_updates=state_updates,
        context_forwarded=forwards,
        dead_letters=dict(letters),
        item_dead_letters=item_letters,
        instances_in_calls=instances,
        outcomes_per_input_max=max(map(_outcomes, decided.values()), default=0),
        duplicate_outcomes=sum(_outcomes(d) - 1 for d in decided.values()),
    )


def final_attempts(
    inputs: set[Position], later: dict[Position, tuple[Position, int]]
) -> tuple[set[Position], set[Position]]:
    """Each input's final attempt (a re-drive supersedes the attempts before it), and the
    attempts superseded. A re-drive whose first attempt is not in `inputs` (before an
    audited range) stands for its input."""
    final: dict[Position, tuple[int, Position]] = {}
    for pos in inputs:
        root, count = later.get(pos, (pos, 0))
        root = root if root in inputs else pos
        if root not in final or count > final[root][0]:
            final[root] = (count, pos)
    finals = {pos for _, pos in final.values()}
    return finals, inputs - finals


def _outcomes(records: Counter[tuple[object, ...]]) -> int:
    """One input's (and turn's) outcomes: its decisions, and every extra copy of a record.
    Records that belong to no decision (an approval's calls, an intake letter) count as
    one decision together when nothing else decided the input."""
    decisions = {what[0] for what in records if what[0] is not None}
    return max(len(decisions), 1) + sum(n - 1 for n in records.values())
