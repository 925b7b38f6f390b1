"""Workflows on units: what each trigger (an input's admission, a batch's turn, a deadline;
results and approvals: answers.py) changes in state, and which records go with that change.

Every change is one transaction of the stores (`with stores.change() as tx:`,
runtime/state/transaction.py), made in one synchronous step: the workflow runs over it
(`Workflow.over`), and its changelog records come back with the trigger's output records.
They are staged together on the trigger's slot (or, for a next turn or a deadline, with
the unit's next commit), so state and outputs commit in one Kafka transaction or not at
all. No order between storing a change and publishing its records has to be kept: a crash
before the commit leaves neither; the next owner restores the store and redoes the trigger.
A batch's turns are made on a transaction while its records are built (`change`), and
stored item by item when they are staged (`commit`): each turn runs once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping

from instanced_stream.core.instance import Instance
from instanced_stream.core.live_spec import SpecSource
from instanced_stream.core.messages import (
    DeadLetter,
    SourcePosition,
)
from instanced_stream.core.workflow import Workflow
from instanced_stream.errors import BadRecord
from instanced_stream.kafka.records import OutRecord
from instanced_stream.observe.metrics import Metrics
from instanced_stream.runtime.pipeline.outcomes.letters import bad_record
from instanced_stream.runtime.pipeline.outcomes.records import (
    Planned,
    RecordBuilder,
)
from instanced_stream.runtime.pipeline.outcomes.size_guard import fit
from instanced_stream.runtime.state.recall import RecallFailed
from instanced_stream.runtime.state.store import Stores, UnitStore
from instanced_stream.runtime.state.transaction import Transaction
from instanced_stream.runtime.units.unit import Slot, Unit

__all__ = ["Effects", "Flows", "recalled"]

log = logging.getLogger("stream.processor")


class Effects:
    """What a trigger changed: its output records (with what they mean, counted by the
    caller), its changelog records, and the next turns it made ready."""

    def __init__(self) -> None:
        self.planned = Planned()
        self.changes: list[OutRecord] = []
        self.ready: list[Instance] = []

    @property
    def records(self) -> list[OutRecord]:
        return [*self.planned.records, *self.changes]


class Flows:
    def __init__(
        self,
        workflow: Workflow,
        stores: Stores,
        builder: RecordBuilder,
        metrics: Metrics,
        worker: str,
        changelog: str,
        max_bytes: int,
    ) -> None:
        self.workflow = workflow
        self.stores = stores
        self.builder = builder
        self.metrics = metrics
        self.worker = worker
        self.changelog = changelog
        self.max_bytes = max_bytes

    def store_for(self, partition: int) -> UnitStore:
        store = UnitStore(self.changelog, partition, self.max_bytes)
        self.stores.add(store)
        return store

    def quarantined(self, store: UnitStore) -> Effects:
        """A restored store's unreadable changelog records: each one's dead letter (its
        key, partition, offset and reason) with its key's tombstone."""
        out = Effects()
        for bad, tombstone in store.quarantine():
            source = SourcePosition(topic=store.topic, partition=bad.partition, offset=bad.offset)
            letter = bad_record(BadRecord("unreadable_state", bad.reason), source, bad.value)
            out.planned.add(self.builder.letter(letter.model_copy(update={"instance": bad.key})))
            out.changes.append(tombstone)
        return out

    def change(self) -> Transaction:
        """A transaction of the stores whose commits the workflow's deadlines follow."""
        return self.stores.change().followed_by(self.workflow.indexed)

    def over(self, tx: Transaction, spec: SpecSource | None = None) -> Workflow:
        """The workflow making its changes on `tx` (`spec`: a batch's edition)."""
        return self.workflow.over(tx, spec)

    # ------------------------------------------------------------------ turns

    def admit(self, inst: Instance) -> tuple[Instance | None, list[OutRecord]]:
        """An input starts (or restarts) its instance's workflow; the change to stage."""
        with self.change() as tx:
            admitted = self.over(tx).admit(inst)
        return admitted, tx.records

    def commit(self, tx: Transaction, inst: Instance) -> Effects:
        """A batch's turn for `inst`, made on `tx` while its records were built, stored;
        one its state cannot hold ends the workflow with a dead letter instead. A turn
        that leaves its workflow ready (steps due and nothing awaited: the model answered
        none of them, or a finish advisor said continue) makes its next turn: no result,
        approval or deadline is coming that would."""
        out = Effects()
        try:
            out.changes += tx.commit(inst.id)
        except BadRecord as exc:  # the state would pass the broker's limit
            out.planned.add(self._letter(inst, exc))
            with self.change() as failed:
                self.over(failed).fail(inst, exc.code, exc.message)
            out.changes += failed.records
            return out
        st = self.stores.get(inst.id)
        nxt = self.workflow.next_turn(st) if st is not None else None
        if nxt is not None:
            out.ready.append(nxt)
        return out

    def _letter(self, inst: Instance, exc: BadRecord) -> Planned:

        return self.builder.letter(
            DeadLetter(
                code=exc.code,
                reason=exc.message,
                scope="item",
                instance=inst.id,
                source=inst.source,
                turn=inst.turn,
            )
        )

    def stage(self, unit: Unit, slot: Slot | None, change: Effects) -> list[Instance]:
        """A trigger's change onto its unit: on its slot, or (`None`: a deadline) with the
        unit's next commit; its records counted. Returns the next turns it made ready."""
        self.metrics.count(change.planned.events)
        self.metrics.decisions.extend(change.planned.decisions)
        if slot is None:
            unit.stage(change.records)
        else:
            unit.finish(slot, change.records)
        return change.ready

    # ------------------------------------------------------------------ deadlines

    def expired(
        self, units: Mapping[int, Unit], now: float | None = None
    ) -> list[tuple[Unit, Instance]]:
        """`expire`, each partition's change staged on its unit (if it still runs here);
        returns the next turns it made ready, with their units."""
        out = []
        for partition, change in self.expire(now).items():
            unit = units.get(partition)  # a running unit: held
            if unit is not None:
                out += [(unit, inst) for inst in self.stage(unit, None, change)]
        return out

    def expire(self, now: float | None = None) -> dict[int, Effects]:
        """Awaited calls past their deadline, workflows past their retention: per
        partition, the records to stage with the unit's next commit."""
        tx = self.change()
        settled = self.over(tx).expire(time.time() if now is None else now)
        refused: set[str | None] = set()
        for name in tx.names:  # each instance stored on its own: one too large stops no other
            try:
                tx.commit(name)
            except BadRecord as exc:
                log.error("the expiry of %s is not stored: %s", name, exc.message)
                refused.add(name)
                kept = self.stores.get(name)  # as it was: due again at the next tick
                if kept is not None:
                    self.workflow.index.update(kept)
        out: dict[int, Effects] = {}
        for nxt, done in settled:
            source = nxt.source if nxt is not None else (done.source if done else None)
            instance = nxt.id if nxt is not None else (done.instance if done else None)
            if source is None or instance in refused:
                continue
            effects = out.setdefault(source.partition, Effects())
            if done is not None:
                effects.planned.add(fit(self.builder.done(done), self.max_bytes, self.builder))
            if nxt is not None:
                effects.ready.append(nxt)
        for partition, changes in tx.by_partition.items():
            out.setdefault(partition, Effects()).changes += changes
        return out


async def recalled(stores: Stores, unit: Unit, instance: str | None) -> bool:
    """The state of `instance` read back if it is kept only on the changelog (a finished
    workflow), before a trigger reads it. False: it could not be (`RecallFailed`, or any
    error of the broker's client: a restart, a DNS blip), or `unit` is gone; a unit whose
    read-back failed fails with that (its partition is reopened after a back-off; nothing
    is decided on a state not read, and the process goes on)."""
    if not unit.held:
        return False
    if instance is not None:
        try:
            await stores.recall(instance)
        except Exception as exc:
            unit.fail(exc if isinstance(exc, RecallFailed) else RecallFailed(repr(exc)))
            return False
    return unit.held
