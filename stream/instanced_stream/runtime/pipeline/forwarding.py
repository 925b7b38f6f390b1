"""Forwarding: a stateful instance's records are processed on its own partition only, so
a record read on another one (an input, a result, an approval) is sent on, in the
reading unit's transaction with its offset, to the same topic's partition its instance
keys to, and nothing else is done with it here. One function for every kind of record:
admission (inputs) and the replies (results and approvals) both ask it."""

from __future__ import annotations

from collections import Counter

from instanced_stream.kafka.publish import forwarded, home_partition
from instanced_stream.kafka.tracing import Headers
from instanced_stream.runtime.pipeline.outcomes.records import Planned
from instanced_stream.runtime.pipeline.staged import Settled
from instanced_stream.runtime.units.unit import Slot, Unit

__all__ = ["forward"]


def forward(
    unit: Unit,
    slot: Slot,
    origin: tuple[str, int, int],
    instance: str,
    value: bytes | None,
    *,
    partitions: int,
    headers: Headers,
) -> Settled | None:
    """The record at `origin` (topic, partition, offset) of `instance` sent on to its home
    partition, as its slot's outcome (counted as `forwarded`); None when it is home."""
    home = home_partition(instance, partitions)
    if home == origin[1]:
        return None
    copy = forwarded(origin, instance, value or b"", home, headers)
    return Settled(unit, slot, Planned(records=[copy], events=Counter({"forwarded": 1})))
