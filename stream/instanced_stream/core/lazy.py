"""A lazy plan's life: proposed once, approved or rejected as a whole, run in dependency
order (the seeds: the model is a pure planner; nothing latent runs before approval).

Turn 1 of an instance is its planning turn: the answer is the graph only (the request's
schema gives latent steps no arguments to fill, and the validator refuses a latent result
as `latent_in_lazy_plan`). The graph is proposed with its id; an approval starts the
steps whose producers are done, each result starts the steps waiting for it (and skips
those on a branch it did not take: `core/plan_graph.py`), and the latent
steps that come due are answered by the model in follow-up turns that name them. The
workflow ends when every step finished; a follow-up turn's calls outside the approved
graph are not run, each a dead letter `outside_plan` (a changed graph would need a new
approval). A rejected proposal ends the workflow, or, while `plan.maxRevisions` allows,
the model plans again on its next turn with the rejected versions and their reasons.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from instanced_stream.core import binding
from instanced_stream.core.instance import Instance
from instanced_stream.core.messages import BatchRef, Call, DoneRecord, ProposalRecord, TraceEntry
from instanced_stream.core.plan_graph import Step, advance, answer_due, due, steps_of, view
from instanced_stream.core.spec import AgentSpec
from instanced_stream.core.state import Ended, InstanceState, Pending, alternatives, write_path

__all__ = [
    "TurnEffects",
    "approve",
    "finish",
    "is_step",
    "planning",
    "progress",
    "propose",
    "reject",
    "turn",
]


@dataclass(slots=True)
class TurnEffects:
    """What a turn's answer does: which of its calls run now, the plan's steps that start
    with it (lazy: stored calls, by the ids they were proposed under), what else to
    publish."""

    run: list[str] = field(default_factory=list)  # call ids of this answer to publish now
    done: DoneRecord | None = None
    proposal: ProposalRecord | None = None
    trace: list[TraceEntry] = field(default_factory=list)
    launch: list[dict[str, Any]] = field(default_factory=list)
    # Call ids of this answer that will never run, with the dead-letter code and reason
    # that record them (a call is published, a no-action, or a dead letter: never lost).
    dropped: dict[str, tuple[str, str]] = field(default_factory=dict)


def is_step(spec: AgentSpec, call: Call) -> bool:
    """Whether a call is a step of a plan: an activity, or a latent call with an output
    (NoAction and thoughts are none; a thought is ephemeral, never recorded)."""
    tool = spec.tool(call.tool)
    return tool is not None and (tool.kind != "latent" or bool(call.output_path))


def planning(spec: AgentSpec, turn: int) -> bool:
    """Whether an instance's turn is a lazy plan's planning turn (its first)."""
    return spec.plan is not None and spec.plan.mode == "lazy" and turn == 1


def finish(st: InstanceState, status: str, reason: str) -> DoneRecord:
    st.status = "done"
    st.ended = Ended(status=status, reason=reason, at=time.time())
    return DoneRecord(
        instance=st.instance,
        status=status,
        reason=reason,
        turns=st.turn,
        state=st.state,
        trace=st.trace,
        source=st.source,
    )


def turn(
    spec: AgentSpec,
    st: InstanceState,
    inst: Instance,
    calls: list[tuple[str, Call]],
    batch: BatchRef,
    first_time: bool,
    timeout: float,
) -> TurnEffects:
    """A lazy plan's turn: the planning turn proposes the graph; a follow-up turn answers
    the due latent steps, and the steps waiting for them start."""
    out = TurnEffects(trace=list(st.trace))
    if planning(spec, inst.turn) or st.revising:
        steps = steps_of(spec, calls, "proposed", inst.turn)
        if not steps:
            out.done = finish(st, "done", "the model planned no call")
        else:
            out.proposal = propose(spec, st, inst, steps, batch)
        return out
    if first_time:
        matched = answer_due(st.plan, calls)
        for step, call in matched:
            if step.wrote:  # the one path its branch collapsed to (plan_graph.collapse)
                write_path(st.state, step.wrote, call.arguments)
        answered = {id(call) for _, call in matched}
        for cid, call in calls:
            if id(call) not in answered and is_step(spec, call):
                out.dropped[cid] = (
                    "outside_plan",
                    f"{call.tool} is no due step of the approved plan: not run (a changed "
                    "plan would need a new approval)",
                )
    out.launch, out.done = progress(spec, st, timeout)
    return out


def propose(
    spec: AgentSpec, st: InstanceState, inst: Instance, steps: list[Step], batch: BatchRef
) -> ProposalRecord:
    """The graph waits for approval, as one proposal with a deterministic id."""
    st.status, st.revising = "awaiting_approval", False
    st.plan = steps
    st.proposal = [s.call for s in steps]
    st.proposal_id = binding.proposal_id(inst)
    return ProposalRecord(
        instance=inst.id,
        proposal_id=st.proposal_id,
        turn=inst.turn,
        batch=batch,
        calls=[{k: v for k, v in s.call.items() if k != "call_id"} for s in steps],
        call_ids=[s.call_id for s in steps],
        plan=view(steps),
        goal=spec.plan.goal if spec.plan else None,
        source=inst.source,
        history=list(st.revisions),
    )


def reject(spec: AgentSpec, st: InstanceState, reason: str) -> DoneRecord | None:
    """A person rejected the proposal: the model plans again with the reason, while
    `plan.maxRevisions` allows; else the workflow ends rejected. Each version stays in
    the history the next proposal carries."""
    limit = spec.plan.max_revisions if spec.plan else 0
    version = {
        "proposal_id": st.proposal_id,
        "turn": st.turn,
        "steps": view(st.plan),
        "reason": reason,
    }
    st.revisions = [*st.revisions, version]
    st.proposal, st.proposal_id = [], ""
    if len(st.revisions) > limit or st.turn >= (spec.plan.max_turns if spec.plan else 1):
        return finish(st, "rejected", reason)
    st.plan, st.status, st.revising = [], "ready", True
    return None


def progress(
    spec: AgentSpec, st: InstanceState, timeout: float
) -> tuple[list[dict[str, Any]], DoneRecord | None]:
    """Starts what can start; returns the activity calls to publish now, and the done
    record when every step finished (or the turn limit leaves due steps unanswered)."""
    run: list[dict[str, Any]] = []
    for step in advance(st.plan, st.state, st.counts):
        if step.kind != "activity":
            continue
        run.append(step.call)
        if step.output:
            st.pending[step.call_id] = Pending(
                tool=step.tool,
                paths=alternatives(step.output),
                deadline=time.time() + timeout,
                turn=st.turn,
            )
    if st.pending:
        st.status = "pending"
        return run, None
    if due(st.plan):
        limit = spec.plan.max_turns if spec.plan else 1
        if st.turn >= limit:
            return run, finish(st, "turn_limit", f"turn limit {limit} reached with steps due")
        st.status = "ready"
        return run, None
    untaken = sum(s.skipped_for == "branch" for s in st.plan)
    lost = sum(s.status != "done" for s in st.plan) - untaken
    reason = "the approved plan ran" + (f"; {lost} steps failed or skipped" if lost else "")
    reason += f"; {untaken} steps on branches not taken" if untaken else ""
    return run, finish(st, "done", reason)


def approve(
    spec: AgentSpec, st: InstanceState, timeout: float
) -> tuple[list[dict[str, Any]], DoneRecord | None]:
    """The whole graph approved: its first steps start."""
    st.proposal, st.proposal_id = [], ""
    for step in st.plan:
        if step.status == "proposed":
            step.status = "approved"
    return progress(spec, st, timeout)
