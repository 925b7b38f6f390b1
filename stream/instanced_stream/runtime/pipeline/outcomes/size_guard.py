"""The size guard of the records workflows write outside a batch (done records, approved
calls): a record over the broker's limit is replaced by a `too_large` dead letter before
it is staged, so it can neither crash the handler that made it nor be redelivered into
the same crash. Batches have theirs in `Staging.stage`; a record the broker refuses
at commit is replaced by `Replacement`."""

from __future__ import annotations

import base64

from instanced_stream.core.messages import SourcePosition
from instanced_stream.kafka.records import OutRecord
from instanced_stream.runtime.pipeline.outcomes.records import Planned, RecordBuilder, oversized
from instanced_stream.runtime.pipeline.outcomes.tally import Tally

__all__ = ["Replacement", "fit", "refused"]


_BATCH = "coordinator"  # the letters' batch id: these records come from no batch


def fit(planned: Planned, limit: int, builder: RecordBuilder) -> Planned:
    """`planned` with every record over `limit` bytes replaced by its dead letter."""
    big = [r for r in planned.records if _size(r) > limit]
    if not big:
        return planned
    out = Planned(
        [r for r in planned.records if _size(r) <= limit],
        planned.events,
        planned.decisions,
    )
    out.add(refused(big, limit, builder))
    return out


def refused(
    records: list[OutRecord], limit: int, builder: RecordBuilder, broker_said: str = ""
) -> Planned:
    """The dead letters of records too large (over `limit`, or refused by the broker:
    `broker_said`), each keyed and placed like the record it replaces."""
    out = Planned()
    for rec in records:
        letter = oversized(rec, None, limit, _BATCH, broker_said)
        source = (
            SourcePosition(topic=rec.origin[0], partition=rec.origin[1], offset=rec.origin[2])
            if rec.origin
            else None
        )
        instance = rec.key.decode("utf-8", "replace") if rec.key else None
        # The copy it keeps must leave the letter itself under the limit.
        kept = base64.b64encode(rec.value[: max(0, limit // 2 - 1024)]).decode() or None
        update = {"instance": instance, "source": source, "raw_b64": kept}
        out.add(builder.letter(letter.model_copy(update=update)))
    return out


def _size(record: OutRecord) -> int:
    return len(record.value) + len(record.key or b"")


class Replacement:
    """The units' `Replace` (runtime/units/collector.py): its item's dead letter, written
    instead of a record the broker refused, counted on `tally`. Built here, below the
    units, so a refusal found while a unit commits goes no further up than this."""

    def __init__(self, limit: int, builder: RecordBuilder, tally: Tally) -> None:
        self.limit, self.builder, self.tally = limit, builder, tally

    def __call__(self, record: OutRecord, said: str) -> list[OutRecord]:
        letters = refused([record], self.limit, self.builder, said)
        self.tally(letters)
        return letters.records
