"""Workflows on units: what each trigger (an input's admission, a turn's answer, a result,
an approval, a deadline) changes in state, and which records go with that change.

Every change is made in one synchronous step on the unit's store, and the changelog
records it queued are taken at once and handed back with the trigger's output records:
they are staged together on the trigger's slot (or, for a next turn or a deadline, with
the unit's next commit), so state and outputs commit in one transaction or not at all.
No order between storing a change and publishing its records has to be kept: a crash
before the commit leaves neither; the next owner restores the store and redoes the trigger.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping

import orjson
from pydantic import ValidationError

from instanced_stream.core.binding import Unbound
from instanced_stream.core.instance import Instance
from instanced_stream.core.messages import (
    ApprovalRecord,
    DeadLetter,
    DoneRecord,
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
    TurnChange,
    bad_result,
)
from instanced_stream.runtime.pipeline.outcomes.size_guard import fit
from instanced_stream.runtime.state.recall import RecallFailed
from instanced_stream.runtime.state.store import Stores, UnitStore
from instanced_stream.runtime.units.unit import Slot, Unit

__all__ = ["Flows", "Staging", "instance_of", "misrouted", "recalled"]

log = logging.getLogger("stream.processor")


class Staging:
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

    def quarantined(self, store: UnitStore) -> Staging:
        """A restored store's unreadable changelog records: each one's dead letter (its
        key, partition, offset and reason) with its key's tombstone."""
        out = Staging()
        for bad in store.quarantine():
            source = SourcePosition(topic=store.topic, partition=bad.partition, offset=bad.offset)
            letter = bad_record(BadRecord("unreadable_state", bad.reason), source, bad.value)
            out.planned.add(self.builder.letter(letter.model_copy(update={"instance": bad.key})))
        out.changes += self._changes(store.partition)
        return out

    def _changes(self, partition: int) -> list[OutRecord]:
        return self.stores.take([partition]).get(partition, [])

    # ------------------------------------------------------------------ turns

    def admit(self, inst: Instance) -> tuple[Instance | None, list[OutRecord]]:
        """An input starts (or restarts) its instance's workflow; the change to stage."""
        admitted = self.workflow.admit(inst)
        return admitted, self._changes(inst.source.partition)

    def rehearsal(self) -> Workflow:
        return self.workflow.rehearsal()

    def apply(self, turn: TurnChange) -> Staging:
        """A batch's turn for one instance, into its store."""
        out = Staging()
        partition = turn.instance.source.partition
        try:
            if turn.failed is not None:
                self.workflow.fail(turn.instance, *turn.failed)
            else:
                self.workflow.turn(
                    turn.instance, turn.calls, turn.batch, turn.opinions, reviews=turn.reviews
                )
        except BadRecord as exc:  # the state would pass the broker's limit
            self._changes(partition)
            out.planned.add(self._letter(turn.instance, exc))
            self.workflow.fail(turn.instance, exc.code, exc.message)
        out.changes += self._changes(partition)
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

    def stage(self, unit: Unit, slot: Slot | None, change: Staging) -> list[Instance]:
        """A trigger's change onto its unit: on its slot, or (`None`: a deadline) with the
        unit's next commit; its records counted. Returns the next turns it made ready."""
        self.metrics.count(change.planned.events)
        self.metrics.decisions.extend(change.planned.decisions)
        if slot is None:
            unit.stage(change.records)
        else:
            unit.finish(slot, change.records)
        return change.ready

    def on_result(self, value: bytes | None, partition: int) -> Staging:
        """An awaited call's result: into state, with its done record and next turn. One
        that answers nothing pending is refused with a dead letter (a repeat is counted)."""
        out = Staging()
        try:
            rec = ResultRecord.model_validate_json(value or b"")
        except ValidationError as exc:
            log.error("not a result record: %s", exc.errors()[:1])
            self.metrics.count({"results_bad": 1})
            reason = f"not a result record: {exc.errors()[:1]}"
            out.planned.add(self._refused("unexpected_result", reason, None, None))
            return out
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
            nxt, done = self.workflow.on_result(rec)
        except BadRecord as exc:  # the state would pass the broker's limit
            self._changes(partition)
            out.planned.add(self.builder.letter(unstorable(rec, exc)))
            nxt, done = self._failed(rec, exc.message, partition)
        launched = self.workflow.take_launched(rec.instance)
        after = self.workflow.store.get(rec.instance)
        if launched and after is not None:  # a lazy plan's steps that waited for it
            out.planned.add(self.builder.approved(after, launched, self.worker))
        if done is not None:
            out.planned.add(self.builder.done(done))
        if nxt is not None:
            out.ready.append(nxt)
        out.planned = fit(out.planned, self.max_bytes, self.builder)
        out.changes += self._changes(partition)
        self.metrics.count({"results": 1})
        return out

    def _failed(
        self, rec: ResultRecord, error: str, partition: int
    ) -> tuple[Instance | None, DoneRecord | None]:
        """A result its state cannot hold is its call's error: the workflow goes on now,
        instead of waiting for the call's deadline as if no result had come."""
        try:
            return self.workflow.on_result(rec.model_copy(update={"value": None, "error": error}))
        except BadRecord:  # the state is at the limit even without it: left to the deadline
            self._changes(partition)
            return None, None

    def on_approval(self, value: bytes | None, partition: int) -> Staging:
        """A person's answer to a lazy plan's proposal, bound to its id and turn."""
        out = Staging()
        try:
            rec = ApprovalRecord.model_validate_json(value or b"")
        except ValidationError as exc:
            log.error("not an approval record: %s", exc.errors()[:1])
            self.metrics.count({"approvals_bad": 1})
            reason = f"not an approval record naming its proposal_id and turn: {exc.errors()[:1]}"
            out.planned.add(self._refused("unexpected_approval", reason, instance_of(value), None))
            return out
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
            proposal, done = self.workflow.on_approval(rec)
        except BadRecord as exc:
            self._changes(partition)
            out.planned.add(self._refused(exc.code, exc.message, rec.instance, None))
            return out
        if st is not None:
            out.planned.add(self.builder.approved(st, proposal, self.worker))
        if done is not None:
            out.planned.add(self.builder.done(done))
        after = self.workflow.store.get(rec.instance)
        nxt = self.workflow.next_turn(after) if after is not None else None
        if nxt is not None:
            out.ready.append(nxt)
        out.planned = fit(out.planned, self.max_bytes, self.builder)
        out.changes += self._changes(partition)
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

    def expire(self, now: float | None = None) -> dict[int, Staging]:
        """Awaited calls past their deadline, workflows past their retention: per
        partition, the records to stage with the unit's next commit."""
        settled = self.workflow.expire(time.time() if now is None else now)
        out: dict[int, Staging] = {}
        for nxt, done in settled:
            source = nxt.source if nxt is not None else (done.source if done else None)
            if source is None:
                continue
            staging = out.setdefault(source.partition, Staging())
            if done is not None:
                staging.planned.add(fit(self.builder.done(done), self.max_bytes, self.builder))
            if nxt is not None:
                staging.ready.append(nxt)
        for partition, changes in self.stores.take().items():
            if changes:
                out.setdefault(partition, Staging()).changes += changes
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
