"""Approving (or rejecting) a lazy plan's proposals: one approval record per instance,
on the partition of its input, where its state lives."""

from __future__ import annotations

import asyncio

from stream.core.messages import ApprovalRecord
from stream.errors import StreamError
from stream.runtime.publish import OutRecord, Publisher
from stream.runtime.topics import read_json
from stream.settings import Settings

__all__ = ["approve"]


def approve(
    settings: Settings,
    bootstrap: str,
    instances: list[str] | None,
    batch: str | None,
    reject: str | None,
) -> list[str]:
    """Publishes an approval (or a rejection with its reason) for every proposal of the
    named instances or batch; returns the instances it answered."""
    proposals = asyncio.run(read_json(bootstrap, settings.topics.proposals))
    chosen = {
        p["instance"]: p
        for p in proposals
        if p["instance"] in (instances or []) or p["batch"]["id"] == batch
    }
    if not chosen:
        raise StreamError("no proposal matches: check the instance ids or the batch id")
    records = [
        OutRecord(
            settings.topics.approvals,
            instance.encode(),
            ApprovalRecord(instance=instance, approve=reject is None, reason=reject)
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
