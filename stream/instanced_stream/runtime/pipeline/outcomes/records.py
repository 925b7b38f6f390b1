"""From a solved batch to the records that say what became of each of its items.

Pure: nothing here publishes, counts or stores. A `Planned` holds the records in the order
they are to be published, the events they mean (counted by `Tally`, outcomes/tally.py) and the
decisions the live page shows. A stateful batch's turns are made on the workflow over a
change of its stores (`Workflow.over`) while its records are built: building stores
nothing, however often it is retried; staging stores each item's change, once, on the slot
of its records, so that both commit in one transaction (runtime/pipeline/workflows.py).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from instanced_stream.core.advice import Consensus, gate, summarise
from instanced_stream.core.instance import Instance
from instanced_stream.core.lazy import is_step
from instanced_stream.core.live_spec import Edition, SpecSource
from instanced_stream.core.messages import (
    ActivityRecord,
    AdviceRecord,
    BatchRef,
    Call,
    DeadLetter,
    DoneRecord,
    NoActionRecord,
    OpinionRecord,
    SourcePosition,
    StateUpdateRecord,
    TraceEntry,
)
from instanced_stream.core.solve import Answer, Outcome
from instanced_stream.core.spec import NO_ACTION, AgentSpec, Tool
from instanced_stream.core.state import InstanceState
from instanced_stream.core.workflow import (
    REVIEW,
    TurnEffects,
    Workflow,
    finish_says_stop,
    unrun_by_stop,
)
from instanced_stream.kafka.records import Origin, OutRecord
from instanced_stream.runtime.pipeline.outcomes.letters import (
    bad_record,
    bad_result,
    item_letter,
    oversized,
    unrun_letter,
)
from instanced_stream.runtime.pipeline.outcomes.scopes import imported
from instanced_stream.settings import Topics

__all__ = [
    "Planned",
    "RecordBuilder",
    "bad_record",
    "bad_result",
    "call_id",
    "oversized",
    "position",
]


def call_id(source: SourcePosition, tool: str, ordinal: int, turn: int = 1) -> str:
    """Same item, turn, tool and ordinal: same id, however often the batch is redone."""
    step = "" if turn == 1 else f"t{turn}/"
    return f"{source.topic}/{source.partition}/{source.offset}/{step}{tool}/{ordinal}"


def position(source: SourcePosition) -> tuple[str, int, int]:
    return (source.topic, source.partition, source.offset)


def _dumps(record: BaseModel) -> bytes:
    # pydantic's own JSON writer: the same bytes as orjson over model_dump(mode="json"),
    # in half the time (no Python dict in between).
    return record.model_dump_json(by_alias=True, exclude_none=True).encode()


def _summary(call: Call) -> str:
    """A call in a few words for people: its tool and its chosen values."""
    values = [str(v) for v in call.arguments.values() if isinstance(v, str) and len(v) < 24]
    return f"{call.tool}({', '.join(values[:2])})"


@dataclass(slots=True)
class Planned:
    records: list[OutRecord] = field(default_factory=list)
    events: Counter[str] = field(default_factory=Counter)
    decisions: list[dict[str, Any]] = field(default_factory=list)

    def add(self, other: Planned) -> None:
        self.records += other.records
        self.events.update(other.events)
        self.decisions += other.decisions


@dataclass(frozen=True, slots=True)
class _Advice:
    """The council's say on one answer: what goes on its records and its advice note."""

    opinions: list[OpinionRecord]
    consensus: Consensus | None = None
    summary: dict[str, Any] | None = None
    gating: Consensus | None = None  # this instance's own advisors' consensus
    unheard: list[str] = field(default_factory=list)

    @property
    def divergent(self) -> bool:
        return bool(self.summary and self.summary["divergent"])


class RecordBuilder:
    """Makes the records on the spec `source` holds: the live spec (read from its one
    holder at each use), or a batch's edition (`at`)."""

    def __init__(self, source: SpecSource, topics: Topics, model: str) -> None:
        self.source = source
        self.topics = topics
        self.model = model
        self.frames: dict[str, bytes] = {}  # topic: its wire-format prefix (kafka/registry.py)

    @property
    def spec(self) -> AgentSpec:
        return self.source.spec

    def at(self, edition: Edition) -> RecordBuilder:
        """This builder on `edition` of the spec: a batch's records are built on the spec
        it was asked on (its advisors' opinions are read by it), whatever changed since."""
        bound = RecordBuilder(edition, self.topics, self.model)
        bound.frames = self.frames
        return bound

    def _out(self, topic: str, key: bytes | None, rec: BaseModel, origin: Origin) -> OutRecord:
        return OutRecord(topic, key, self.frames.get(topic, b"") + _dumps(rec), origin)

    # ------------------------------------------------------------------ dead letters

    def letter(self, letter: DeadLetter) -> Planned:
        # A record refused before it had an instance (a frame no schema decodes, not
        # JSON) keeps its producer's key: `stream tail deadletter` and a keyed consumer
        # find it by what the producer called it.
        producer_key = letter.source.key if letter.source is not None else None
        named = letter.instance or producer_key
        key = named.encode() if named else None
        origin = position(letter.source) if letter.source else None
        record = self._out(self.topics.dead_letter, key, letter, origin)
        return Planned([record], Counter({f"dead_letter.{letter.code}": 1}))

    def internal_errors(
        self,
        batch_id: str,
        instances: list[Instance],
        error: Exception,
        attempts: int,
        flow: Workflow | None,
    ) -> Planned:
        """Each item's dead letter, for a batch that kept failing; `flow` (over a change):
        each item's workflow ends with it."""
        out = Planned()
        for inst in instances:
            if flow is not None:
                flow.fail(inst, "internal_error", repr(error)[:200])
            why = f"processing failed: {error!r}"[:2000]
            out.add(self.letter(item_letter(inst, "internal_error", why, attempts, batch_id)))
        return out

    # ------------------------------------------------------------------ a solved batch

    def batch(self, batch_id: str, outcome: Outcome, flow: Workflow | None) -> Planned:
        """Every record of a solved batch. `flow`: the workflow over a change of its stores,
        where each answer's turn is made (stored by the caller, with the records)."""
        out = Planned(
            events=Counter(
                llm_requests=outcome.requests,
                consults=outcome.consults,
                stray_opinions=outcome.stray_opinions,
                dedupe_spared=outcome.spared,
            )
        )
        # Keep input order: answers arrive grouped by ask, not by offset.
        for answer in sorted(outcome.answers, key=lambda a: a.instance.source.offset):
            self._answer(out, batch_id, answer, flow)
        for refusal, owner, attempt in outcome.refusals:
            out.add(
                self.letter(
                    DeadLetter(
                        code=refusal.code,
                        reason=refusal.reason,
                        scope="call",
                        instance=owner.id if owner else None,
                        source=owner.source if owner else None,
                        call=refusal.call,
                        attempts=attempt,
                        batch_id=batch_id,
                        turn=owner.turn if owner else 1,
                    )
                )
            )
            out.events[f"refused.{refusal.code}"] += 1
        for miss in outcome.unanswered:
            if flow is not None:  # its workflow ends with its dead letter
                flow.fail(miss.instance, miss.code, miss.reason)
            letter = item_letter(miss.instance, miss.code, miss.reason, miss.attempts, batch_id)
            out.add(self.letter(letter))
        return out

    def _answer(self, out: Planned, batch_id: str, answer: Answer, flow: Workflow | None) -> None:
        """An answer's records, straight into the batch's `out`: a Planned per answer and
        per call, each merged, showed in the processor's profile."""
        inst, first = answer.instance, len(out.records)
        key, origin = inst.id.encode(), position(inst.source)
        batch = BatchRef(id=batch_id, size=answer.size, token=answer.token, attempt=answer.attempt)
        advice = _advice(self.spec, answer)
        # The model addressed a token; the world gets the producer's id back.
        ordinals: Counter[str] = Counter()
        calls: list[tuple[str, Call]] = []
        for call in answer.calls:
            cid = call_id(inst.source, call.tool, ordinals[call.tool], inst.turn)
            calls.append((cid, call.model_copy(update={"instance": inst.id})))
            ordinals[call.tool] += 1
        if flow is None:
            effects = TurnEffects(run=[cid for cid, _ in calls])
            alone = answer.size == 1  # a request-wide opinion judged this instance only then
            if self.spec.plan is None and finish_says_stop(self.spec, answer.opinions, alone):
                # No workflow to end, but the prompt's promise holds: a stop's calls do
                # not run (each a dead letter `stopped`).
                effects = TurnEffects(dropped=unrun_by_stop(self.spec, calls, "not run"))
        else:
            reviews = {cid: r for cid, c in calls if (r := _review(self.spec, c, advice))}
            effects = flow.turn(inst, calls, batch, answer.opinions, reviews=reviews)
        # Without a plan nothing is stored: a latent output goes with the instance's outcome.
        outputs = [
            c.wire()
            for cid, c in calls
            if flow is None and _latent_output(self.spec, c) and cid not in effects.dropped
        ]
        reviewed = self._calls(out, inst, calls, batch, advice, effects, flow, outputs)
        if effects.launch and flow is not None:
            # A lazy plan's steps that waited for this turn's latent answers.
            st = flow.store.get(inst.id)
            if st is not None:
                out.add(self.approved(st, effects.launch, batch.id))
        if effects.proposal is not None:
            out.records.append(self._out(self.topics.proposals, key, effects.proposal, origin))
            out.events["proposals"] += 1
        if effects.done is not None:
            out.records.append(self._out(self.topics.done, key, effects.done, origin))
            out.events["done"] += 1
        if len(out.records) == first and outputs:
            # Only latent calls writing †state, and no plan to keep it: the answer is the
            # instance's state update, published as one (the seeds' manager example).
            update = StateUpdateRecord(
                instance=inst.id, source=inst.source, batch=batch, turn=inst.turn, updates=outputs
            )
            out.records.append(self._out(self.topics.state_updates, key, update, origin))
            out.events["state_updates"] += 1
        elif len(out.records) == first:
            # Only thoughts (or a plan's latent steps): no action, said so; a thought (no
            # `_outputPath`) is ephemeral: never published, not even here.
            rec = NoActionRecord(
                instance=inst.id, reason="only latent calls", source=inst.source, batch=batch
            ).model_copy(update={"latent": outputs, "turn": inst.turn})
            out.records.append(self._out(self.topics.no_action, key, rec, origin))
        out.decisions.append(_decision(self.spec, inst, calls, advice))
        if advice.consensus is not None:
            note = _advice_record(answer, batch, advice, calls, reviewed)
            out.records.append(self._out(self.topics.advice, key, note, origin))
            out.events["advisor_opinions"] += len(advice.opinions)
            out.events["divergent"] += int(note.divergent)

    def _calls(
        self,
        out: Planned,
        inst: Instance,
        calls: list[tuple[str, Call]],
        batch: BatchRef,
        advice: _Advice,
        effects: TurnEffects,
        flow: Workflow | None,
        outputs: list[dict[str, Any]],
    ) -> list[str]:
        """The records of an answer's calls, into `out`; returns the reviewed call ids."""
        key, origin = inst.id.encode(), position(inst.source)
        reviewed: list[str] = []
        for cid, call in calls:
            if cid in effects.dropped:  # never runs: recorded, with why
                out.add(self.letter(unrun_letter(inst, call, batch, *effects.dropped[cid])))
                continue
            if call.tool == NO_ACTION:
                rec = NoActionRecord(
                    instance=inst.id,
                    reason=str(call.arguments.get("reason", "")),
                    source=inst.source,
                    batch=batch,
                    turn=inst.turn,
                    latent=outputs,  # without a plan, the answer's latent outputs go here too
                )
                out.records.append(self._out(self.topics.no_action, key, rec, origin))
                out.events["no_action"] += 1
                continue
            tool = self.spec.tool(call.tool)
            assert tool is not None  # the validator admits known tools only
            if tool.kind == "latent":
                # The model answered it itself: never published; with `_outputPath` the
                # workflow wrote its arguments to state.
                out.events["latent_calls"] += 1
                continue
            if cid not in effects.run:
                continue  # proposed (lazy plan): runs when approved
            review = _review(self.spec, call, advice)
            if review:
                reviewed.append(cid)
                out.events["reviewed"] += 1
            state = _state_of(inst, flow) if call.scopes else {}
            shown = advice.summary
            trace = effects.trace
            self.add_call(out, tool, cid, call, inst, batch, shown, review, trace, state, outputs)
        return reviewed

    # ------------------------------------------------------------------ single records

    def add_call(
        self,
        out: Planned,
        tool: Tool,
        cid: str,
        call: Call,
        inst: Instance,
        batch: BatchRef,
        advice: dict[str, Any] | None,
        review: str | None,
        trace: list[TraceEntry],
        state: dict[str, Any],
        latent: list[dict[str, Any]] | None = None,
    ) -> None:
        """One call's activity record (or its review record, when the gate holds it),
        added to `out` and counted; `latent`: a planless answer's latent outputs."""
        rec = ActivityRecord(
            call_id=cid,
            tool=call.tool,
            instance=inst.id,
            call=call,
            context=imported(self.spec, inst, call.scopes, state),
            source=inst.source,
            batch=batch,
            model=self.model,
            advice=advice,
            review=review,
            turn=inst.turn,
            trace=trace,
            latent=latent or [],
        )
        topic = self.topics.review if review else tool.topic or self.topics.activity(tool.name)
        out.records.append(self._out(topic, inst.id.encode(), rec, position(inst.source)))
        out.events[f"calls.{call.tool}"] += 1

    def approved(self, st: InstanceState, proposal: list[dict[str, Any]], worker: str) -> Planned:
        """The calls of an approved proposal, with the ids they were proposed under."""
        out = Planned()
        if st.source is None or not proposal:
            return out
        inst = Instance(st.instance, st.input, st.source, 0, st.state, st.turn)
        batch = BatchRef(id=f"{worker}-approved", size=1, token="", attempt=1)
        for stored in proposal:
            cid, review = stored["call_id"], stored.get(REVIEW)  # a held step's verdict
            call = Call.model_validate({k: v for k, v in stored.items() if k not in _STORED})
            tool = self.spec.tool(call.tool)
            if tool and tool.kind != "latent":
                trace = list(st.trace)
                self.add_call(out, tool, cid, call, inst, batch, None, review, trace, st.state)
                out.events["plan_calls_executed"] += 1
        return out

    def done(self, done: DoneRecord) -> Planned:
        origin = position(done.source) if done.source else None
        record = self._out(self.topics.done, done.instance.encode(), done, origin)
        return Planned([record], Counter(done=1))


_STORED = ("call_id", REVIEW)  # a stored call's keys that are not the call's


def _advice_record(
    answer: Answer,
    batch: BatchRef,
    advice: _Advice,
    calls: list[tuple[str, Call]],
    reviewed: list[str],
) -> AdviceRecord:
    return AdviceRecord(
        instance=answer.instance.id,
        turn=answer.instance.turn,
        source=answer.instance.source,
        batch=batch,
        opinions=advice.opinions,
        consensus=advice.consensus.as_dict() if advice.consensus else {},
        divergent=advice.divergent,
        consulted=answer.consulted,
        questions=[{"advisor": a, "question": q} for a, q in answer.questions],
        call_ids=[cid for cid, _ in calls],
        reviewed=reviewed,
    )


def _latent_output(spec: AgentSpec, call: Call) -> bool:
    tool = spec.tool(call.tool)
    return tool is not None and tool.kind == "latent" and bool(call.output_path)


def _advice(spec: AgentSpec, answer: Answer) -> _Advice:
    if not spec.advisors:
        return _Advice([])
    opinions, consensus = summarise(spec, answer.opinions)
    _, gating = summarise(spec, answer.opinions, instanced_only=True)
    summary = {
        **consensus.as_dict(),
        "divergent": consensus.divergence >= spec.advice.divergence_alert,
        "votes": {o.advisor: o.votes for o in opinions},
        "consulted": answer.consulted,
    }
    return _Advice(opinions, consensus, summary, gating, list(answer.unheard))


def _decision(
    spec: AgentSpec, inst: Instance, calls: list[tuple[str, Call]], advice: _Advice
) -> dict[str, Any]:
    """One line of the live page's latest decisions."""
    # A step, never a thought: a thought's text is shown nowhere (the seeds: ephemeral).
    first = next((c for _, c in calls if is_step(spec, c)), None)
    consensus = advice.consensus
    return {
        "instance": inst.id,
        "decision": _summary(first) if first else "no action",
        "consensus": {"option": consensus.option, "score": round(consensus.score, 2)}
        if consensus
        else None,
        "divergent": advice.divergent,
        "votes": advice.summary["votes"] if advice.summary else {},
    }


def _state_of(inst: Instance, flow: Workflow | None) -> dict[str, Any]:
    if flow is not None:
        st = flow.store.get(inst.id)
        if st is not None:
            return st.state
    return inst.state or {}


def _review(spec: AgentSpec, call: Call, advice: _Advice) -> str | None:
    """Why the gate holds this call for review, or None."""
    settings = spec.advice
    if settings.mode != "gate":
        return None
    if advice.unheard and settings.missing == "review":
        return f"fails closed: no valid opinion from {advice.unheard} on this instance"
    return gate(call, advice.gating, settings) if advice.gating else None
