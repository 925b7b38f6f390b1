"""Dead letters about one record: a bad input, a bad result, an output too large, an
item that ends unanswered, a call its workflow never runs.

Each keeps a capped copy of what it is about, so the letter itself always fits the
broker's record limit.
"""

from __future__ import annotations

import base64

from instanced_stream.core.instance import Instance
from instanced_stream.core.messages import BatchRef, Call, DeadLetter, ResultRecord, SourcePosition
from instanced_stream.errors import BadRecord
from instanced_stream.kafka.records import OutRecord

__all__ = ["bad_record", "bad_result", "item_letter", "oversized", "unrun_letter"]

_RAW_KEEP = 64 * 1024  # bytes of a bad record kept in its dead letter


def bad_result(rec: ResultRecord, problem: str) -> DeadLetter:
    """An awaited call's result that broke its tool's `_output` schema."""
    return DeadLetter(
        code="bad_result",
        reason=problem,
        scope="call",
        instance=rec.instance,
        source=rec.source,
        call={"call_id": rec.call_id, "_tool": rec.tool, "value": rec.value},
    )


def bad_record(exc: BadRecord, source: SourcePosition, value: bytes | None) -> DeadLetter:
    return DeadLetter(
        code=exc.code,
        reason=exc.message,
        scope="item",
        source=source,
        # Capped: a dead letter must never be too large for the broker itself.
        raw_b64=base64.b64encode(value[:_RAW_KEEP]).decode() if value else None,
        raw_size=len(value) if value is not None else None,
    )


def oversized(
    record: OutRecord, owner: Instance | None, limit: int, batch_id: str, broker_said: str = ""
) -> DeadLetter:
    """A dead letter in place of an output too large for the broker (over our own limit,
    or refused by the broker: `broker_said`), with a capped copy of it (so the letter
    itself always fits)."""
    why = (
        f"the broker refused it: {broker_said}"
        if broker_said
        else f"the broker takes at most {limit} (settings.max_output_bytes)"
    )
    return DeadLetter(
        code="too_large",
        reason=f"an output for {record.topic} is {len(record.value)} bytes; {why}"[:1000],
        scope="item",
        instance=owner.id if owner else None,
        source=owner.source if owner else None,
        batch_id=batch_id,
        turn=owner.turn if owner else 1,
        raw_b64=base64.b64encode(record.value[:_RAW_KEEP]).decode(),
        raw_size=len(record.value),
    )


def unrun_letter(inst: Instance, call: Call, batch: BatchRef, code: str, why: str) -> DeadLetter:
    """The dead letter of a call its workflow will never run (TurnEffects.dropped)."""
    letter = DeadLetter.model_validate(
        {"code": code, "reason": why, "scope": "call", "instance": inst.id}
    )
    update = {"source": inst.source, "call": call.wire(), "batch_id": batch.id, "turn": inst.turn}
    return letter.model_copy(update=update)


def item_letter(inst: Instance, code: str, reason: str, attempts: int, batch_id: str) -> DeadLetter:
    """The dead letter an item of a batch ends in, at its turn."""
    return DeadLetter(
        code=code,
        reason=reason,
        scope="item",
        instance=inst.id,
        source=inst.source,
        attempts=attempts,
        batch_id=batch_id,
        turn=inst.turn,
    )
