"""The workflow coordinator: awaited results, approvals, turns and expiry, on Kafka.

Each trigger (a turn's answer, a result record, an approval record, a deadline) changes an
instance's state and has effects: records to publish, a next turn to batch. The order:

1. What the world answers is recorded before it is asked: a turn's and an approved
   proposal's awaited calls are stored as pending before they are published, because a
   result can come back before the publish of the whole batch completes.
2. Everything else goes out before the state that follows from it: the done record of a
   result or an expiry is published, then the workflow is stored as ended, so a crash in
   between repeats the record on redelivery instead of losing it. The record is found by
   a rehearsal (`Workflow.rehearsal`: the same change, nothing stored).
3. The trigger's offset is finished last (by the pipeline), and a next turn is batched
   only once its state is stored.

Each change itself is one synchronous get-and-put, so nothing else runs in between. What
rule 1 leaves open (a crash after the state, before the publish) is in docs/architecture.md.
"""

from __future__ import annotations

import logging
import time

from pydantic import ValidationError

from stream.core.instance import Instance
from stream.core.messages import ApprovalRecord, ResultRecord
from stream.core.workflow import Workflow
from stream.ops.metrics import Metrics
from stream.runtime.delivery import Delivery
from stream.runtime.records import Planned, RecordBuilder, TurnChange

__all__ = ["Coordinator"]

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

    def admit(self, inst: Instance) -> Instance:
        """An input or state record (re)starts its instance's workflow."""
        return inst if self.workflow is None else self.workflow.admit(inst)

    def rehearsal(self) -> Workflow | None:
        """Where a batch's turns are staged while its records are built."""
        return None if self.workflow is None else self.workflow.rehearsal()

    def store(self, turns: list[TurnChange]) -> None:
        """A batch's turns, into state before its calls are published (idempotent per
        trigger: a redone batch finds its turns applied)."""
        if self.workflow is not None:
            for t in turns:
                self.workflow.turn(t.instance, t.calls, t.batch, t.opinions)

    async def on_result(self, value: bytes | None) -> list[Instance]:
        """An activity's result for an awaited call; returns the next turn, if any."""
        try:
            rec = ResultRecord.model_validate_json(value or b"")
        except ValidationError as exc:
            log.error("not a result record: %s", exc.errors()[:1])
            self.metrics.count({"results_bad": 1})
            return []
        if self.workflow is None:
            return []
        _, done = self.workflow.rehearsal().on_result(rec)
        if done is not None:
            await self.delivery.publish(self.builder.done(done))
        nxt, _ = self.workflow.on_result(rec)
        self.metrics.count({"results": 1})
        return [nxt] if nxt is not None else []

    async def on_approval(self, value: bytes | None) -> list[Instance]:
        """A person approved or rejected a lazy plan's proposal."""
        try:
            rec = ApprovalRecord.model_validate_json(value or b"")
        except ValidationError as exc:
            log.error("not an approval record: %s", exc.errors()[:1])
            self.metrics.count({"approvals_bad": 1})
            return []
        if self.workflow is None:
            return []
        # Stored first: the approved calls' results may come back before their publish
        # completes (rule 1 of the module's docstring).
        proposal, done = self.workflow.on_approval(rec)
        st = self.workflow.store.get(rec.instance)
        planned = Planned()
        if st is not None:
            planned.add(self.builder.approved(st, proposal, self.worker))
        if done is not None:
            planned.add(self.builder.done(done))
        await self.delivery.publish(planned)
        return []

    async def expire(self, now: float | None = None) -> list[Instance]:
        """Fails awaited calls past their deadline; returns the instances ready for a
        next turn (after a restart nobody else would offer them)."""
        if self.workflow is None:
            return []
        now = time.time() if now is None else now
        rehearsed = self.workflow.rehearsal().expire(now)
        if not rehearsed:
            return []
        planned = Planned()
        for _, done in rehearsed:
            if done is not None:
                planned.add(self.builder.done(done))
        if planned.records:
            await self.delivery.publish(planned)
        return [nxt for nxt, _ in self.workflow.expire(now) if nxt is not None]
