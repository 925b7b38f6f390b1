"""The workflow coordinator: awaited results, approvals, turns and expiry, on Kafka.

Each trigger (a turn's answer, a result record, an approval record, a deadline) changes an
instance's state and has effects: records to publish, a next turn to batch. The order:

1. What the world answers is recorded before it is asked: a turn's and an approved
   proposal's records are stored with the state change, in its outbox, before they are
   published (a result can come back before the publish of the whole batch completes);
   once the broker acknowledged them the outbox is emptied (`paid`). A crash in between
   leaves the outbox full, and `recover` publishes it again, byte for byte, when the
   partition is next assigned; a redelivered input whose turn was applied is not redone
   (`Workflow.admit`).
2. The done record of a result or an expiry is published before the workflow is stored as
   ended, so a crash in between repeats the record on redelivery instead of losing it. The
   record is found by a rehearsal (`Workflow.rehearsal`: the same change, nothing stored).
3. State is flushed (the changelog acknowledged) before the trigger's offset is finished,
   and a next turn is batched only once its state is stored.

Each change itself is one synchronous get-and-put, so nothing else runs in between.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import orjson
from pydantic import ValidationError

from instanced_stream.core.binding import Unbound
from instanced_stream.core.instance import Instance
from instanced_stream.core.messages import ApprovalRecord, DeadLetter, ResultRecord, SourcePosition
from instanced_stream.core.state import Outgoing
from instanced_stream.core.workflow import Workflow
from instanced_stream.ops.metrics import Metrics
from instanced_stream.runtime.delivery import Delivery
from instanced_stream.runtime.guard import fit, refused
from instanced_stream.runtime.publish import OutRecord, PublishError
from instanced_stream.runtime.records import (
    Planned,
    RecordBuilder,
    TurnChange,
    bad_result,
    position,
)

__all__ = ["Coordinator", "instance_of", "refusal_letter"]

log = logging.getLogger("stream.processor")


class Coordinator:
    """Without a workflow (no plan, no awaited call) there is no state: the triggers are
    read and counted, and change nothing."""

    def __init__(
        self,
        workflow: Workflow | None,
        builder: RecordBuilder,
        delivery: Delivery,
        metrics: Metrics,
        worker: str,
    ) -> None:
        self.workflow = workflow
        self.builder = builder
        self.delivery = delivery
        self.metrics = metrics
        self.worker = worker

    def admit(self, inst: Instance) -> Instance | None:
        """An input or state record (re)starts its instance's workflow; None: a redelivered
        record whose turn was applied (nothing to redo)."""
        return inst if self.workflow is None else self.workflow.admit(inst)

    def rehearsal(self) -> Workflow | None:
        """Where a batch's turns are staged while its records are built."""
        return None if self.workflow is None else self.workflow.rehearsal()

    def store(self, turns: list[TurnChange], records: list[OutRecord]) -> None:
        """A batch's turns, into state with the records they owe, before those are
        published (idempotent per trigger: a redone batch finds its turns applied)."""
        if self.workflow is None:
            return
        for t in turns:
            if t.failed is not None:
                self.workflow.fail(t.instance, *t.failed)
                continue
            key, origin = t.instance.id.encode(), position(t.instance.source)
            owed = [_owed(r) for r in records if r.key == key and r.origin == origin]
            self.workflow.turn(t.instance, t.calls, t.batch, t.opinions, owed)

    def paid(self, turns: list[TurnChange]) -> None:
        """The batch's records were acknowledged: its turns owe nothing any more."""
        if self.workflow is not None:
            for t in turns:
                self.workflow.paid(t.instance.id)

    async def flush(self) -> None:
        """Returns once every state change so far is durable."""
        if self.workflow is not None:
            await self.workflow.store.flush()

    async def recover(self, owns: Callable[[int], bool]) -> list[Instance]:
        """After an assignment: publishes what owned workflows still owe (a crash came
        between their change and its publish), and returns those waiting for a turn."""
        if self.workflow is None:
            return []
        ready: list[Instance] = []
        owing = self.workflow.owing(owns)
        log.info(
            "recovery: %d workflows owe records or wait for a turn: %s",
            len(owing),
            [(st.instance, st.status, len(st.outbox)) for st in owing[:20]],
        )
        for listed in owing:
            # Read again: the agents run meanwhile, and whatever this processor changed
            # since (a turn it made ready, an outbox it wrote) is its own to finish. An
            # outbox another processor wrote stays owed when a result changed the state
            # here: a crash mid-publish can leave some of its records unpublished.
            st = self.workflow.store.get(listed.instance)
            if st is None or not st.left(self.workflow.owner):
                continue
            turn_left = st.status == "ready" and st.owner != self.workflow.owner
            if st.outbox and st.outbox_owner != self.workflow.owner:
                key = st.instance.encode()
                origin = position(st.source) if st.source else None
                records = [
                    OutRecord(o.topic, key, o.value.encode(), origin, o.partition)
                    for o in st.outbox
                ]
                await self.delivery.sink.publish(records)
                self.workflow.paid(st.instance, theirs=True)  # ours now: taken over once
                log.info("recovery: %s owed %d records; published", st.instance, len(records))
                self.metrics.count({"outbox_republished": len(records)})
                st = self.workflow.store.get(st.instance)
            nxt = self.workflow.next_turn(st) if st is not None and turn_left else None
            if nxt is not None:
                ready.append(nxt)
        await self.flush()
        if ready:
            log.info("recovery: %d workflows resume their next turn", len(ready))
        return ready

    async def on_result(self, value: bytes | None) -> list[Instance]:
        """An activity's result for an awaited call; returns the next turn, if any."""
        try:
            rec = ResultRecord.model_validate_json(value or b"")
        except ValidationError as exc:
            log.error("not a result record: %s", exc.errors()[:1])
            self.metrics.count({"results_bad": 1})
            await self._refuse("unexpected_result", f"not a result record: {exc.errors()[:1]}")
            return []
        if self.workflow is None:
            return []
        unbound = self.workflow.refusal(rec)
        if unbound is not None:
            # Said either way, so a workflow that waits on a result the topic holds can be
            # told from one whose result never came; only a repeat is not a refusal.
            log.info("result %s not applied: %s", rec.call_id, unbound.reason)
            await self._unbound(unbound, "unexpected_result", rec.instance, rec.source)
            return []
        problem = self.workflow.result_problem(rec)
        if problem is not None:
            # Said first (rule 2), then the result counts as the call's error. The letter
            # holds the value: it goes through the size guard too.
            await self._publish(self.builder.letter(bad_result(rec, problem)))
            rec = rec.model_copy(update={"value": None, "error": problem})
        _, done = self.workflow.rehearsal().on_result(rec)
        if done is not None:
            await self._publish(self.builder.done(done))
        nxt, _ = self.workflow.on_result(rec)
        await self.flush()
        self.delivery.probe.at("after_result")  # stored; its offset and next turn to come
        self.metrics.count({"results": 1})
        return [nxt] if nxt is not None else []

    async def on_approval(self, value: bytes | None) -> list[Instance]:
        """A person approved or rejected a lazy plan's proposal."""
        try:
            rec = ApprovalRecord.model_validate_json(value or b"")
        except ValidationError as exc:
            log.error("not an approval record: %s", exc.errors()[:1])
            self.metrics.count({"approvals_bad": 1})
            reason = f"not an approval record naming its proposal_id and turn: {exc.errors()[:1]}"
            await self._refuse("unexpected_approval", reason, instance_of(value))
            return []
        if self.workflow is None:
            return []
        unbound = self.workflow.refusal(rec)
        if unbound is not None:
            log.info("approval for %s not applied: %s", rec.instance, unbound.reason)
            await self._unbound(unbound, "unexpected_approval", rec.instance, None)
            return []
        # Rehearsed to build the records, then stored with them in its outbox: the
        # approved calls' results may come back before their publish completes (rule 1).
        proposal, done = self.workflow.rehearsal().on_approval(rec)
        st = self.workflow.store.get(rec.instance)
        if st is None or st.status != "awaiting_approval":
            # A repeat (redelivered after a crash): what the first one owes is still in
            # the outbox, and `recover` publishes it; emptying it here would lose it.
            self.workflow.results_ignored += 1
            return []
        planned = Planned()
        if st is not None:
            planned.add(self.builder.approved(st, proposal, self.worker))
        if done is not None:
            planned.add(self.builder.done(done))
        planned = fit(planned, self.delivery.max_output_bytes, self.builder)  # before staging
        self.workflow.on_approval(rec, [_owed(r) for r in planned.records])
        await self.flush()
        self.delivery.probe.at("after_approval")  # approval stored, its calls not yet out
        await self._publish(planned)
        self.workflow.paid(rec.instance)
        return []

    async def expire(
        self, now: float | None = None, owns: Callable[[int], bool] = lambda _: True
    ) -> list[Instance]:
        """Fails awaited calls past their deadline; returns the instances it made ready
        for their next turn."""
        if self.workflow is None:
            return []
        now = time.time() if now is None else now
        # Only the states due now are read (an index, not a scan of every state), and the
        # real expiry runs whenever one is due: it also forgets the workflows that ended
        # `retention_s` ago, which no rehearsal reports.
        due = self.workflow.due(now, owns)
        if not due:
            return []
        planned = Planned()
        for _, done in self.workflow.rehearsal().expire(now, owns, due):
            if done is not None:
                planned.add(self.builder.done(done))
        if planned.records:
            await self._publish(planned)
        ready = [nxt for nxt, _ in self.workflow.expire(now, owns, due) if nxt is not None]
        await self.flush()
        return ready

    # ------------------------------------------------- refusals and the size guard (#24)

    async def _publish(self, planned: Planned) -> None:
        """Publishes with the size guard: a record over the limit, or one the broker
        refuses, becomes a too_large dead letter; nothing raises out of a handler."""
        limit = self.delivery.max_output_bytes
        try:
            await self.delivery.publish(fit(planned, limit, self.builder))
        except PublishError as exc:
            log.error("coordinator: %s", exc.message)
            await self.delivery.publish(refused(exc.refused, limit, self.builder, exc.message))

    async def _unbound(
        self, unbound: Unbound, code: str, instance: str, source: SourcePosition | None
    ) -> None:
        """A result or approval that answers nothing pending: a repeat is counted and
        ignored (at-least-once delivery makes it normal), anything else dead-lettered."""
        assert self.workflow is not None
        if unbound.repeat:
            self.workflow.results_ignored += 1
            self.metrics.count({"answers_repeated": 1})
            return
        await self._refuse(code, unbound.reason, instance, source)

    async def _refuse(
        self,
        code: str,
        reason: str,
        instance: str | None = None,
        source: SourcePosition | None = None,
    ) -> None:
        await self.delivery.publish(
            self.builder.letter(refusal_letter(code, reason, instance, source))
        )


def refusal_letter(
    code: str, reason: str, instance: str | None, source: SourcePosition | None
) -> DeadLetter:
    """The dead letter of a result or approval that answers nothing pending."""
    letter = DeadLetter.model_validate(
        {"code": code, "reason": reason[:1000], "scope": "call", "instance": instance}
    )
    return letter if source is None else letter.model_copy(update={"source": source})


def instance_of(value: bytes | None) -> str | None:
    """The instance a malformed approval names, if it names one (its dead letter's key)."""
    try:
        found = orjson.loads(value or b"")
    except orjson.JSONDecodeError:
        return None
    name = found.get("instance") if isinstance(found, dict) else None
    return name if isinstance(name, str) else None


def _owed(record: OutRecord) -> Outgoing:
    return Outgoing(topic=record.topic, value=record.value.decode(), partition=record.partition)
