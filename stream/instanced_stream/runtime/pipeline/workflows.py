"""Workflows on units: what each trigger (an input's admission, a turn's answer, a result,
an approval, a deadline) changes in state, and which records go with that change.

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

import contextlib
import logging
import time
from collections.abc import Mapping

import orjson
from pydantic import ValidationError

from instanced_stream.core.binding import Unbound
from instanced_stream.core.instance import Instance
from instanced_stream.core.live_spec import SpecSource
from instanced_stream.core.messages import (
    ApprovalRecord,
    DeadLetter,
    ResultRecord,
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
    bad_result,
)
from instanced_stream.runtime.pipeline.outcomes.size_guard import fit
from instanced_stream.runtime.state.recall import RecallFailed
from instanced_stream.runtime.state.store import Stores, UnitStore
from instanced_stream.runtime.state.transaction import Transaction
from instanced_stream.runtime.units.unit import Slot, Unit

__all__ = ["Effects", "Flows", "instance_of", "misrouted", "recalled"]

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
        one its state cannot hold ends the workflow with a dead letter instead."""
        out = Effects()
        try:
            out.changes += tx.commit(inst.id)
        except BadRecord as exc:  # the state would pass the broker's limit
            out.planned.add(self._letter(inst, exc))
            with self.change() as failed:
                self.over(failed).fail(inst, exc.code, exc.message)
            out.changes += failed.records
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

    # ------------------------------------------------------------------ results

    def answer(
        self, unit: Unit, slot: Slot, value: bytes | None, *, result: bool
    ) -> list[Instance]:
        """A result (`result`) or an approval consumed at `unit`: its change staged on its
        slot; returns the next turns it made ready."""
        on = self.on_result if result else self.on_approval
        return self.stage(unit, slot, on(value, unit.partition))

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

    def on_result(self, value: bytes | None, partition: int) -> Effects:
        """An awaited call's result: into state, with its done record and next turn. One
        that answers nothing pending is refused with a dead letter (a repeat is counted)."""
        try:
            rec = ResultRecord.model_validate_json(value or b"")
        except ValidationError as exc:
            return self._malformed("result", exc, "not a result record", None)
        out = Effects()
        declared = rec.source.partition if rec.source is not None else None
        wrong = self._misrouted("result", rec.instance, declared, partition)
        if wrong is not None:
            out.planned.add(self._refused("wrong_partition", wrong, rec.instance, rec.source))
            return out
        unbound = self.workflow.refusal(rec)
        if unbound is not None:
            log.info("result %s not applied: %s", rec.call_id, unbound.reason)
            out.planned.add(self._unbound(unbound, "unexpected_result", rec.instance, rec.source))
            return out
        problem = self.workflow.result_problem(rec)
        if problem is not None:
            out.planned.add(self.builder.letter(bad_result(rec, problem)))
            rec = rec.model_copy(update={"value": None, "error": problem})
        try:
            self._result(out, rec)
        except BadRecord as exc:  # the state would pass the broker's limit
            out.planned.add(self.builder.letter(unstorable(rec, exc)))
            # A result its state cannot hold is its call's error: the workflow goes on
            # now, instead of waiting for the call's deadline as if no result had come.
            failed = rec.model_copy(update={"value": None, "error": exc.message})
            with contextlib.suppress(BadRecord):  # at the limit even so: left to the deadline
                self._result(out, failed)
        out.planned = fit(out.planned, self.max_bytes, self.builder)
        self.metrics.count({"results": 1})
        return out

    def _result(self, out: Effects, rec: ResultRecord) -> None:
        """`rec` into its instance's state, in one transaction; once it is stored, what it
        made (the steps it started, the done record, the next turn) goes into `out`."""
        with self.change() as tx:
            flow = self.over(tx)
            nxt, done = flow.on_result(rec)
            launched = flow.take_launched(rec.instance)
            after = flow.store.get(rec.instance)
        if launched and after is not None:  # a lazy plan's steps that waited for it
            out.planned.add(self.builder.approved(after, launched, self.worker))
        if done is not None:
            out.planned.add(self.builder.done(done))
        if nxt is not None:
            out.ready.append(nxt)
        out.changes += tx.records

    def on_approval(self, value: bytes | None, partition: int) -> Effects:
        """A person's answer to a lazy plan's proposal, bound to its id and turn."""
        try:
            rec = ApprovalRecord.model_validate_json(value or b"")
        except ValidationError as exc:
            reason = "not an approval record naming its proposal_id and turn"
            return self._malformed("approval", exc, reason, instance_of(value))
        out = Effects()
        wrong = self._misrouted("approval", rec.instance, None, partition)
        if wrong is not None:
            out.planned.add(self._refused("wrong_partition", wrong, rec.instance, None))
            return out
        unbound = self.workflow.refusal(rec)
        if unbound is not None:
            log.info("approval for %s not applied: %s", rec.instance, unbound.reason)
            out.planned.add(self._unbound(unbound, "unexpected_approval", rec.instance, None))
            return out
        st = self.workflow.store.get(rec.instance)
        try:
            with self.change() as tx:
                flow = self.over(tx)
                proposal, done = flow.on_approval(rec)
                after = flow.store.get(rec.instance)
        except BadRecord as exc:
            out.planned.add(self._refused(exc.code, exc.message, rec.instance, None))
            return out
        if st is not None:
            out.planned.add(self.builder.approved(st, proposal, self.worker))
        if done is not None:
            out.planned.add(self.builder.done(done))
        nxt = self.workflow.next_turn(after) if after is not None else None
        if nxt is not None:
            out.ready.append(nxt)
        out.planned = fit(out.planned, self.max_bytes, self.builder)
        out.changes += tx.records
        return out

    def _malformed(
        self, kind: str, exc: ValidationError, reason: str, instance: str | None
    ) -> Effects:
        """A result or approval (`kind`) that cannot be read: refused with a dead letter."""
        log.error("%s: %s", reason, exc.errors()[:1])
        self.metrics.count({f"{kind}s_bad": 1})
        out = Effects()
        why = f"{reason}: {exc.errors()[:1]}"
        out.planned.add(self._refused(f"unexpected_{kind}", why, instance, None))
        return out

    def _misrouted(
        self, what: str, instance: str, declared: int | None, partition: int
    ) -> str | None:
        wrong = misrouted(what, instance, declared, partition, self.stores.partition_of(instance))
        if wrong is not None:
            self.metrics.count({"answers_misrouted": 1})
        return wrong

    def _unbound(
        self, unbound: Unbound, code: str, instance: str, source: SourcePosition | None
    ) -> Planned:
        if unbound.repeat:  # a redelivery of what was applied: normal, counted
            self.workflow.results_ignored += 1
            self.metrics.count({"answers_repeated": 1})
            return Planned()
        return self._refused(code, unbound.reason, instance, source)

    def _refused(
        self, code: str, reason: str, instance: str | None, source: SourcePosition | None
    ) -> Planned:
        return self.builder.letter(refusal_letter(code, reason, instance, source))

    # ------------------------------------------------------------------ deadlines

    def expired(
        self, units: Mapping[int, Unit], now: float | None = None
    ) -> list[tuple[Unit, Instance]]:
        """`expire`, each partition's change staged on its unit (if still alive here);
        returns the next turns it made ready, with their units."""
        out = []
        for partition, change in self.expire(now).items():
            unit = units.get(partition)
            if unit is not None and unit.alive:
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
    if not unit.alive:
        return False
    if instance is not None:
        try:
            await stores.recall(instance)
        except Exception as exc:
            unit.fail(exc if isinstance(exc, RecallFailed) else RecallFailed(repr(exc)))
            return False
    return unit.alive


def refusal_letter(
    code: str, reason: str, instance: str | None, source: SourcePosition | None
) -> DeadLetter:
    """The dead letter of a result or approval that answers nothing pending."""
    letter = DeadLetter.model_validate(
        {"code": code, "reason": reason[:1000], "scope": "call", "instance": instance}
    )
    return letter if source is None else letter.model_copy(update={"source": source})


def unstorable(rec: ResultRecord, exc: BadRecord) -> DeadLetter:
    """The dead letter of a result its instance's state cannot hold (`exc`): it names the
    call, and leaves out the value that was too large."""
    call = {"call_id": rec.call_id, "_tool": rec.tool}
    letter = DeadLetter.model_validate(
        {"code": exc.code, "reason": exc.message, "scope": "call", "instance": rec.instance}
    )
    return letter.model_copy(update={"source": rec.source, "call": call})


def instance_of(value: bytes | None) -> str | None:
    """The instance a malformed approval names, if it names one (its dead letter's key)."""
    try:
        found = orjson.loads(value or b"")
    except orjson.JSONDecodeError:
        return None
    name = found.get("instance") if isinstance(found, dict) else None
    return name if isinstance(name, str) else None


def misrouted(
    what: str, instance: str, declared: int | None, partition: int, home: int | None
) -> str | None:
    """Why a result or approval that arrived on `partition` is on the wrong one, if it
    is. The contract (asyncapi.yaml): both are written to the partition of their
    instance's input, the `source.partition` of the activity record or proposal they
    answer, whatever their key hashes to. Only the unit of that partition may apply
    them: its transaction holds the instance's state and the answer's offset together.
    `declared`: the partition the record itself names (a result's `source`); `home`: the
    owned partition whose store holds the instance, if any."""
    if declared is not None and declared != partition:
        expected = declared
    elif home is not None and home != partition:
        expected = home
    else:
        return None
    return (
        f"the {what} for instance {instance!r} arrived on partition {partition}, but "
        f"its instance's input is on partition {expected}: write {what}s to the "
        "source.partition of the record they answer (a partitioner hashing the key "
        "does not find it)"
    )
