"""Results and approvals: each one bound to what it answers (a result to its call and
turn, an approval to its proposal), written into its instance's state in one transaction
of the stores, its records and next turn handed back; anything else refused with a dead
letter and a reason, never applied to a newer step (docs/architecture.md, exactly once).

Both arrive co-partitioned: on the partition of the input they answer, whose unit holds
the instance's state, so the answer's offset and the state change commit together. One
that arrived elsewhere is refused (`misrouted`); the service forwards those it can place.
"""

from __future__ import annotations

import contextlib
import logging

import orjson
from pydantic import ValidationError

from instanced_stream.core.binding import Unbound
from instanced_stream.core.instance import Instance
from instanced_stream.core.messages import (
    ApprovalRecord,
    DeadLetter,
    ResultRecord,
    SourcePosition,
)
from instanced_stream.errors import BadRecord
from instanced_stream.runtime.pipeline.outcomes.records import Planned, bad_result
from instanced_stream.runtime.pipeline.outcomes.size_guard import fit
from instanced_stream.runtime.pipeline.workflows import Effects, Flows
from instanced_stream.runtime.units.unit import Slot, Unit

__all__ = ["Answers", "instance_of", "misrouted", "refusal_letter", "unstorable"]

log = logging.getLogger("stream.processor")


class Answers:
    """Applies the results and approvals consumed at the units to the workflows (`flows`)."""

    def __init__(self, flows: Flows) -> None:
        self.flows = flows
        self.workflow = flows.workflow
        self.builder = flows.builder
        self.metrics = flows.metrics
        self.worker = flows.worker
        self.max_bytes = flows.max_bytes

    def answer(
        self, unit: Unit, slot: Slot, value: bytes | None, *, result: bool
    ) -> list[Instance]:
        """A result (`result`) or an approval consumed at `unit`: its change staged on its
        slot; returns the next turns it made ready."""
        on = self.on_result if result else self.on_approval
        return self.flows.stage(unit, slot, on(value, unit.partition))

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
        with self.flows.change() as tx:
            flow = self.flows.over(tx)
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
            with self.flows.change() as tx:
                flow = self.flows.over(tx)
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
        wrong = misrouted(
            what, instance, declared, partition, self.flows.stores.partition_of(instance)
        )
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
