"""An eager plan's turns: planning is execution, in the graph's order.

The seeds' eager mode: the model plans and acts in one generation. Its answer's steps
join the instance's graph (core/plan_graph.py) and start as their inputs allow: the
latent steps the plan showed as due are answered first; an activity runs now or when what
it reads is in; a latent step answered in the answer is written when what it reads
exists, else it is due for the next turn (its first answer was a guess). A turn ends the
workflow when it leaves nothing pending, nothing unfinished and made no awaited call, a
finish advisor votes stop, or the turn limit is reached.
"""

from __future__ import annotations

import time
from typing import Any

from instanced_stream.core import finish, lazy, plan_graph
from instanced_stream.core.instance import Instance
from instanced_stream.core.lazy import TurnEffects
from instanced_stream.core.lazy import finish as _finish
from instanced_stream.core.messages import Call, DoneRecord
from instanced_stream.core.spec import AgentSpec
from instanced_stream.core.state import (
    Ended,
    InstanceState,
    Pending,
    alternatives,
    write_path,
)
from instanced_stream.core.validate import Opinion

__all__ = [
    "REVIEW",
    "advance",
    "finish_says_stop",
    "settled",
    "stopped",
    "turn",
    "unrun_by_stop",
]

# In a held eager step's stored call: the advice gate's verdict of its turn, so that the
# call goes to review when its producers finish, as it would have with the answer.
REVIEW = "_review"


def turn(
    spec: AgentSpec,
    st: InstanceState,
    inst: Instance,
    calls: list[tuple[str, Call]],
    first_time: bool,
    timeout: float,
    reviews: dict[str, str] | None = None,
) -> TurnEffects:
    """Planning is execution, in the graph's order: the latent steps the plan showed as
    due are answered first; then this answer's steps start as their inputs allow (a
    latent one answered here is written when what it reads exists, else it becomes due
    for the next turn; activities run now or, held, when what they read is in: each keeps
    its gate verdict of `reviews`). The turn's steps join the instance's plan."""
    out = TurnEffects()
    if spec.plan is None:
        # One-shot: no call awaits anything (the spec refuses awaited tools without a
        # plan), so nothing can wait for another call: all run now; a latent output
        # belongs to the instance's outcome record (runtime/pipeline/outcomes/records.py).
        out.run = [cid for cid, c in calls if (t := spec.tool(c.tool)) and t.kind != "latent"]
    elif first_time:
        answered = {id(c) for _, c in _answer_due(st, calls)}
        fresh = [(cid, c) for cid, c in calls if id(c) not in answered]
        steps = plan_graph.steps_of(spec, fresh, "approved", inst.turn)
        st.plan = [*st.plan, *steps]
        given = dict(fresh)
        run, out.launch = advance(st, given, timeout)
        out.run = [s.call_id for s in run]
        for step in steps:
            if step.status == "approved" and reviews and step.call_id in reviews:
                step.call[REVIEW] = reviews[step.call_id]
    else:  # applied before: the calls that started then
        out.run = [
            s.call_id
            for s in st.plan
            if s.turn == inst.turn and s.kind == "activity" and s.status in ("running", "done")
        ]
    out.trace = list(st.trace)
    if st.pending:
        st.status = "pending"
    else:
        out.done = _maybe_done(spec, st, _awaited(spec, calls))
    return out


def _awaited(spec: AgentSpec, calls: list[tuple[str, Call]]) -> bool:
    return any(
        (t := spec.tool(c.tool)) is not None and t.kind != "latent" and bool(c.output_path)
        for _, c in calls
    )


def _answer_due(st: InstanceState, calls: list[tuple[str, Call]]) -> list[tuple[str, Call]]:
    """The answer's latent calls that answer the steps the plan showed as due: written to
    state (their steps done). Returns them, so they make no new step."""
    matched = plan_graph.answer_due(st.plan, calls)
    for step, call in matched:
        if step.wrote:  # the one path its branch collapsed to (plan_graph.collapse)
            write_path(st.state, step.wrote, call.arguments)
    return [(step.call_id, call) for step, call in matched]


def advance(
    st: InstanceState, given: dict[str, Call], timeout: float
) -> tuple[list[plan_graph.Step], list[dict[str, Any]]]:
    """Starts what can start, in the graph's order, until nothing more can: an activity
    runs (awaited: pending); a latent step whose answer is in `given` (this answer's
    calls, by id) is written and done, so its readers may start in turn; one without
    stays due, for the model's next turn. Returns the steps of `given` that run and the
    stored calls of earlier turns that start now (to publish)."""
    run: list[plan_graph.Step] = []
    launch: list[dict[str, Any]] = []
    while started := plan_graph.advance(st.plan, st.state, st.counts):
        for step in started:
            if step.kind == "latent":
                call = given.get(step.call_id)
                if call is not None and step.output:
                    path = plan_graph.collapse(step, call)  # a branch: the first path
                    write_path(st.state, path, call.arguments)
                    step.status, step.wrote = "done", path
                continue
            if step.output:
                st.pending[step.call_id] = _pending(step, timeout)
            if step.call_id in given:
                run.append(step)
            else:
                launch.append(step.call)
    return run, launch


def stopped(spec: AgentSpec, st: InstanceState, calls: list[tuple[str, Call]]) -> TurnEffects:
    """A finish advisor voted stop: the workflow ends, whatever is still awaited no longer
    matters, and this answer's calls are not run (each recorded as `stopped`)."""
    st.pending = {}
    out = TurnEffects(trace=list(st.trace))
    out.done = _finish(st, "stopped", "a finish advisor voted stop")
    out.dropped = unrun_by_stop(spec, calls, "the workflow ended, unrun")
    return out


def unrun_by_stop(
    spec: AgentSpec, calls: list[tuple[str, Call]], what: str
) -> dict[str, tuple[str, str]]:
    """The calls a finish advisor's stop keeps from running, each with the dead letter
    that records it (`stopped`); NoAction and thoughts are no calls to run."""
    why = f"a finish advisor voted stop in this answer: {what}"
    return {cid: ("stopped", why) for cid, c in calls if lazy.is_step(spec, c)}


def _pending(step: plan_graph.Step, timeout: float) -> Pending:
    assert step.output is not None
    return Pending(
        tool=step.tool,
        paths=alternatives(step.output),
        deadline=time.time() + timeout,
        turn=step.turn,
    )


def _maybe_done(spec: AgentSpec, st: InstanceState, awaited: bool) -> DoneRecord | None:
    """A turn that left nothing pending: the workflow ends, or is ready for its next (a
    step due or waiting for one keeps it going: the model answers the due ones)."""
    if spec.plan is None:
        st.status = "done"
        return None  # single-turn: nothing more to report than the calls themselves
    reason: tuple[str, str] | None = None
    unfinished = not plan_graph.finished(st.plan)
    if st.turn >= spec.plan.max_turns and (awaited or unfinished):
        reason = ("turn_limit", f"turn limit {spec.plan.max_turns} reached")
    elif not awaited and not unfinished:
        reason = ("done", "the model made no more awaited calls" + _skipped(st))
    if reason is None:
        st.status = "ready"
        return None
    return _finish(st, *reason)


def _skipped(st: InstanceState) -> str:
    """What the done record says of steps that never ran for want of an input."""
    lost = st.counts.get(plan_graph.SKIPPED_INPUT, 0)
    return f"; {lost} steps not run: a step they read failed" if lost else ""


def settled(spec: AgentSpec, st: InstanceState) -> DoneRecord | None:
    """A result or an expiry answered a call: the last one ends the turn."""
    if st.pending or st.status != "pending":
        return None
    if spec.plan is None:
        st.status = "done"
        st.ended = Ended(status="done", reason="every awaited call answered", at=time.time())
    elif st.turn >= spec.plan.max_turns:
        return _finish(st, "turn_limit", "turn limit reached")
    else:
        st.status = "ready"
    return None


def finish_says_stop(spec: AgentSpec, opinions: list[Opinion], alone: bool = True) -> bool:
    """The finish advisors that judged the instance say stop (core/finish.py `say`)."""
    return finish.say(spec, opinions, alone) == "stop"
