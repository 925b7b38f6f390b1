"""Conservation check: every input item must end as a published call, an explicit
NoAction, or an item-level dead letter. Reports missing, duplicated and unexpected records.

Shipped as `stream audit` so users can run the same check against their own topics.
"""

from __future__ import annotations

from collections import Counter

import orjson
from pydantic import BaseModel, Field

from stream.core.messages import ITEM_CODES
from stream.runtime.topics import read_topic
from stream.settings import Topics

__all__ = ["AuditReport", "audit"]

Position = tuple[str, int, int]


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
    dead_letters: dict[str, int] = Field(description="Dead letters by code (item and call)")
    item_dead_letters: int = Field(description="Items that ended in a dead letter")
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


async def audit(bootstrap: str, topics: Topics, activity_topics: list[str]) -> AuditReport:
    """Reads the input topic and every outcome topic (activity, review, no-action, dead
    letters) and reports which input items have no outcome."""
    input_topic = topics.input
    inputs: set[Position] = set()
    async for rec in read_topic(bootstrap, input_topic):
        inputs.add((input_topic, rec.partition, rec.offset))
    accounted: set[Position] = set()
    unexpected = 0
    calls: Counter[str] = Counter()
    letters: Counter[str] = Counter()
    seen_ids: set[str] = set()
    duplicates = fire_and_forget = no_action = item_letters = reviewed = proposals = 0
    instances: list[str] = []
    lettered: set[tuple[object, object, object]] = set()

    def mark(source: dict[str, object] | None) -> None:
        nonlocal unexpected
        if not source:
            return
        pos = (str(source["topic"]), int(source["partition"]), int(source["offset"]))  # type: ignore[call-overload]
        if pos[0] != input_topic:
            return
        if pos in inputs:
            accounted.add(pos)
        else:
            unexpected += 1

    for topic in [*activity_topics, topics.review]:
        async for raw in read_topic(bootstrap, topic):
            rec = orjson.loads(raw.value or b"{}")
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
    async for raw in read_topic(bootstrap, topics.no_action):
        no_action += 1
        mark(orjson.loads(raw.value or b"{}").get("source"))
    async for raw in read_topic(bootstrap, topics.proposals):
        proposals += 1  # a lazy plan's outcome: the proposal waits for a person
        mark(orjson.loads(raw.value or b"{}").get("source"))
    async for raw in read_topic(bootstrap, topics.dead_letter):
        rec = orjson.loads(raw.value or b"{}")
        letters[rec.get("code", "?")] += 1
        if rec.get("scope") == "item" and rec.get("code") in ITEM_CODES:
            # Items, not records: a batch redone after a crash repeats its dead letters.
            src = rec.get("source") or {}
            where = (src.get("topic"), src.get("partition"), src.get("offset"))
            if not src or where not in lettered:
                item_letters += 1
                lettered.add(where)
            mark(rec.get("source"))
    return AuditReport(
        inputs=len(inputs),
        accounted=len(accounted),
        missing=sorted(inputs - accounted),
        duplicate_calls=duplicates,
        unexpected=unexpected,
        calls_by_tool=dict(calls),
        fire_and_forget=fire_and_forget,
        reviewed=reviewed,
        proposals=proposals,
        no_action=no_action,
        dead_letters=dict(letters),
        item_dead_letters=item_letters,
        instances_in_calls=instances,
    )
