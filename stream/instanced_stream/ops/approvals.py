"""Approving (or rejecting) a lazy plan's proposals: one approval record per proposal,
naming it (its `proposal_id` and `turn`), on the partition of its instance's input, where
its state lives.

What is offered is what is pending now, not the proposals topic's history: per instance
only its latest proposal (a later turn, or a restarted workflow, supersedes the earlier
ones), and not one an approval on the approvals topic already names, nor one whose
workflow has ended since (a done record of the same input at that turn or later). The
processor is the judge all the same: an approval that names anything but the proposal
pending when it is read is refused there with a dead letter (`unexpected_approval`).
"""

from __future__ import annotations

import asyncio
from typing import Any

from instanced_stream.core.messages import ApprovalRecord
from instanced_stream.errors import StreamError
from instanced_stream.kafka.publish import Publisher
from instanced_stream.kafka.records import OutRecord
from instanced_stream.kafka.topics import read_json
from instanced_stream.settings import Settings

__all__ = ["approve", "pending_now", "pending_proposals"]

Record = dict[str, Any]


def _input_of(record: Record) -> tuple[Any, Any, Any]:
    src = record.get("source") or {}
    return (src.get("topic"), src.get("partition"), src.get("offset"))


def pending_proposals(
    proposals: list[Record], approvals: list[Record], done: list[Record]
) -> list[Record]:
    """The proposals still waiting for an answer, each topic read in its order (an
    instance's records share one partition, so their order is the order they happened)."""
    latest: dict[str, Record] = {}
    for p in proposals:
        latest.pop(p["instance"], None)  # re-inserted: the listing keeps the latest order
        latest[p["instance"]] = p
    answered = {a.get("proposal_id") for a in approvals}
    ended = {(d["instance"], _input_of(d)): int(d.get("turns", 0)) for d in done}
    return [
        p
        for p in latest.values()
        # one without an id predates the binding: no approval can answer it any more
        if p.get("proposal_id")
        and p["proposal_id"] not in answered
        and ended.get((p["instance"], _input_of(p)), -1) < int(p["turn"])
    ]


async def pending_now(settings: Settings, bootstrap: str) -> list[Record]:
    """`pending_proposals` over the proposals, approvals and done topics as they are."""
    topics = settings.topics
    proposals, approvals, done = await asyncio.gather(
        read_json(bootstrap, topics.proposals),
        read_json(bootstrap, topics.approvals),
        read_json(bootstrap, topics.done),
    )
    return pending_proposals(proposals, approvals, done)


def approve(
    settings: Settings,
    bootstrap: str,
    instances: list[str] | None,
    batch: str | None,
    reject: str | None,
) -> list[str]:
    """Publishes an approval (or a rejection with its reason) for the pending proposal of
    each named instance, or of every instance of the batch; returns the instances."""
    pending = asyncio.run(pending_now(settings, bootstrap))
    chosen = {
        p["instance"]: p
        for p in pending
        if p["instance"] in (instances or []) or p["batch"]["id"] == batch
    }
    if not chosen:
        raise StreamError(
            "no pending proposal matches: check the instance ids or the batch id "
            "(`stream approve --list` shows what is pending)"
        )
    records = [
        OutRecord(
            settings.topics.approvals,
            instance.encode(),
            ApprovalRecord(
                instance=instance,
                proposal_id=p["proposal_id"],
                turn=p["turn"],
                approve=reject is None,
                reason=reject,
            )
            .model_dump_json(exclude_none=True)
            .encode(),
            # the partition of the instance's input: where its state lives
            partition=(p.get("source") or {}).get("partition"),
        )
        for instance, p in chosen.items()
    ]

    async def send() -> None:
        publisher = Publisher(bootstrap, client_id="stream-approve")
        await publisher.start()
        try:
            await publisher.publish(records)
        finally:
            await publisher.stop()

    asyncio.run(send())
    return sorted(chosen)
