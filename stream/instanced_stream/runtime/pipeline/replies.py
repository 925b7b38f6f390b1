"""The replies: the results and approvals consumed at the units, each applied by its
partition's lane (runtime/units/lanes.py), in the order its partition read them. One
read where its instance does not live is forwarded there (`forward`, forwarding.py); a
stateless spec has nothing awaiting them: they are read and committed, never decided
(both written by staging, the one writer of outcomes); the others are applied to their
instance's workflow (`Answers`, answers.py), and the next turns they make ready handed
on (`ready`)."""

from __future__ import annotations

from collections.abc import Callable

from instanced_stream.core.instance import Instance
from instanced_stream.faultpoints import NO_PROBE, Probe
from instanced_stream.runtime.pipeline.answers import Answers, instance_of
from instanced_stream.runtime.pipeline.forwarding import forward
from instanced_stream.runtime.pipeline.outcomes.records import Planned
from instanced_stream.runtime.pipeline.staged import Settled
from instanced_stream.runtime.pipeline.staging import Staging
from instanced_stream.runtime.pipeline.workflows import recalled
from instanced_stream.runtime.units.fetcher import Fetched
from instanced_stream.runtime.units.unit import Unit

__all__ = ["Replies"]

Ready = Callable[[Unit, list[Instance]], None]


class Replies:
    """Routes each result (read on `results`) and approval. `answers`: None for a
    stateless spec. `partitions`: the input topic's, where instances live."""

    def __init__(
        self,
        staging: Staging,
        answers: Answers | None,
        ready: Ready,
        *,
        results: str,
        partitions: int,
        probe: Probe = NO_PROBE,
    ) -> None:
        self.staging, self.answers, self.ready = staging, answers, ready
        self.results, self.partitions, self.probe = results, partitions, probe

    async def take(self, got: Fetched) -> None:
        """One result or approval, tracked on its slot. Raises `UnitGone` when its unit no
        longer serves (its lane stops; the record is redone by the partition's owner)."""
        unit, slot, rec = got.unit, got.slot, got.record
        if self.answers is None:
            ignored = Planned()
            ignored.events["results_ignored"] += 1
            self.staging.settle(Settled(unit, slot, ignored))
            return
        instance = instance_of(rec.value)
        if instance is not None:
            origin = (rec.topic, rec.partition, rec.offset)
            moved = forward(
                unit,
                slot,
                origin,
                instance,
                rec.value,
                partitions=self.partitions,
                headers=tuple(rec.headers),
            )
            if moved is not None:
                self.staging.settle(moved)
                return
        if not await recalled(self.answers.flows.stores, unit, instance):
            return  # its unit failed: the partition is reopened and the record redone
        result = rec.topic == self.results
        self.ready(unit, self.answers.answer(unit, slot, rec.value, result=result))
        # Staged on its unit, not yet committed.
        self.probe.at("after_result" if result else "after_approval")
