"""Stateful workflows: awaited calls, instance state across turns, and plans.

A call with `_outputPath` is awaited: recorded as pending in its instance's state until
its result arrives (or its deadline passes). With a plan, an instance whose awaited calls
are all answered is ready for its next turn; its workflow ends when a turn makes no
awaited call, a `finish` advisor votes stop, or the turn limit is reached, and its final
state is published as a done record. A lazy plan stores each turn's calls as a proposal
and runs them only when approved.

Every method changes state at once (one get and one put, no await in between, so nothing
else runs meanwhile). A caller that must publish a change's effects before storing the
change (so that a crash between the two repeats the effects instead of losing them) asks
a `rehearsal()` first: the same workflow over a store that keeps its writes to itself.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from instanced_stream.core import binding, lazy, plan_graph
from instanced_stream.core.advice import Vote as _Vote
from instanced_stream.core.advice import aggregate, parse_votes
from instanced_stream.core.binding import Unbound
from instanced_stream.core.expiry import DueIndex, forget_retired
from instanced_stream.core.instance import Instance
from instanced_stream.core.lazy import TurnEffects
from instanced_stream.core.lazy import finish as _finish
from instanced_stream.core.messages import (
    ApprovalRecord,
    BatchRef,
    Call,
    DoneRecord,
    ResultRecord,
    TraceEntry,
)
from instanced_stream.core.spec import AgentSpec
from instanced_stream.core.state import (
    Ended,
    InstanceState,
    Outgoing,
    Pending,
    StagedStore,
    StateStore,
    alternatives,
    path_problem,
    write_path,
)
from instanced_stream.core.validate import Opinion

__all__ = ["REVIEW", "TurnEffects", "Workflow"]

# In a held eager step's stored call: the advice gate's verdict of its turn, so that the
# call goes to review when its producers finish, as it would have with the answer.
REVIEW = "_review"


class Workflow:
    def __init__(
        self,
        spec: AgentSpec,
        store: StateStore,
        pending_timeout_s: float,
        retention_s: float = 86_400.0,
        owner: str = "",
    ) -> None:
        self.spec = spec
        self.store = store
        self.owner = owner  # stamped on every change (see `owing`)
        self.timeout = pending_timeout_s
        self.retention_s = retention_s
        self.results_ignored = 0
        self.expired = 0
        self.index = DueIndex(retention_s)  # kept by `_put` and the deletions
        self._launched: dict[str, list[dict[str, Any]]] = {}

    @property
    def iterative(self) -> bool:
        return self.spec.plan is not None

    @property
    def lazy(self) -> bool:
        return self.spec.plan is not None and self.spec.plan.mode == "lazy"

    def rehearsal(self) -> Workflow:
        """This workflow over a staged copy of its store: what a change would do (its
        records, its next turn), with nothing stored and no counter moved."""
        return Workflow(
            self.spec, StagedStore(self.store), self.timeout, self.retention_s, self.owner
        )

    def admit(self, inst: Instance) -> Instance | None:
        """An input or state record arrives: it starts (or restarts) its instance's
        workflow, and the model sees the instance's state with it. None: this very record
        started the workflow before (redelivered after a crash) and its first turn was
        applied; what that turn owed is in the outbox (`recover`), so nothing is redone."""
        st = self.store.get(inst.id)
        if st is not None and st.source == inst.source and st.status != "new":
            return None
        st = st or InstanceState(instance=inst.id, partition=inst.source.partition)
        if inst.payload.get("type") == "state":
            st.state.update({k: v for k, v in inst.payload.items() if k != "type"})
        else:
            st.input = dict(inst.payload)
        st.partition, st.source = inst.source.partition, inst.source
        st.turn, st.status, st.pending, st.proposal = 0, "new", {}, []
        st.ended, st.plan = None, []
        self._put(st)
        return Instance(inst.id, inst.payload, inst.source, inst.size, dict(st.state) or None, 1)

    def turn(
        self,
        inst: Instance,
        calls: list[tuple[str, Call]],
        batch: BatchRef,
        opinions: list[Opinion],
        owed: list[Outgoing] | None = None,
        reviews: dict[str, str] | None = None,
    ) -> TurnEffects:
        """Applies a turn's answer to the instance's state (once, however often the batch
        is redone) and says which calls run now. `owed`: the records this turn publishes,
        kept in the outbox until `paid`; `reviews`: the advice gate's verdicts by call
        id, kept with a step that waits for a result."""
        st = self.store.get(inst.id)
        if st is None:
            return TurnEffects(run=[cid for cid, _ in calls])
        first_time = st.mark(
            f"turn{inst.turn}@{inst.source.topic}/{inst.source.partition}/{inst.source.offset}"
        )
        if first_time:
            st.turn = inst.turn
            st.trace.append(
                TraceEntry(turn=inst.turn, batch_id=batch.id, call_ids=[cid for cid, _ in calls])
            )
        if self.iterative and _finish_says_stop(self.spec, opinions):
            out = _stopped(self.spec, st, calls)
        elif self.lazy:
            out = lazy.turn(self.spec, st, inst, calls, batch, first_time, self.timeout)
        else:
            out = _eager(self.spec, st, inst, calls, first_time, self.timeout, reviews)
        if owed is not None:
            st.owe(owed, self.owner)
        self._put(st)
        return out

    def fail(self, inst: Instance, code: str, reason: str) -> None:
        """A turn ended in a dead letter (unanswered, refused, an internal error): the
        workflow ends with it, instead of waiting for a turn that will never come."""
        st = self.store.get(inst.id)
        if st is None or st.status == "done" or st.source != inst.source:
            return
        st.status, st.pending, st.proposal = "done", {}, []
        st.ended = Ended(status="dead_lettered", reason=f"{code}: {reason}"[:500], at=time.time())
        self._put(st)

    def _put(self, st: InstanceState) -> None:
        st.owner = self.owner
        self.store.put(st)
        self.index.update(st)

    def due(self, now: float, owns: Callable[[int], bool] = lambda _: True) -> list[str]:
        """Owned instances past a deadline or their retention (the index is built from the
        store on the first call; each restore adds its partition's states to it)."""
        if not self.index.built:
            self.index.rebuild(self.store.items(), self.store.retired())
        return self.index.due(now, owns)

    def paid(self, instance: str, *, theirs: bool = False) -> None:
        """The outbox's records were acknowledged by the broker. `theirs`: recovery
        republished an outbox another processor left; else only an outbox written here
        is emptied."""
        st = self.store.get(instance)
        if st is not None and st.outbox and (theirs or st.outbox_owner == self.owner):
            st.outbox, st.outbox_owner = [], self.owner
            self._put(st)

    def next_turn(self, st: InstanceState) -> Instance | None:
        """The instance's next turn, when its workflow is ready for one."""
        if not self.iterative or st.status != "ready" or st.source is None:
            return None
        return Instance(
            st.instance,
            st.input or {"type": "input"},
            st.source,
            256,
            dict(st.state),
            st.turn + 1,
            None if st.revising else plan_graph.view(st.plan) or None,
            st.revisions if st.revising else None,
        )

    def refusal(self, rec: ResultRecord | ApprovalRecord) -> Unbound | None:
        """None when `rec` answers what is pending now, else why not (`core/binding.py`)."""
        st = self.store.get(rec.instance)
        if st is None:
            return Unbound(f"no workflow of instance {rec.instance!r} is stored here")
        if isinstance(rec, ResultRecord):
            return binding.result_refusal(st, rec)
        return binding.approval_refusal(st, rec)

    def result_problem(self, rec: ResultRecord) -> str | None:
        """Why a result breaks its `_output` schema or cannot be written (`core/binding.py`)."""
        st = self.store.get(rec.instance)
        return None if st is None else binding.result_problem(self.spec, st, rec)

    def on_result(self, rec: ResultRecord) -> tuple[Instance | None, DoneRecord | None]:
        """Writes an awaited call's result into state; one that cannot be written is the
        call's error, never raised. Unbound ones are ignored (refused first: `refusal`)."""
        st = self.store.get(rec.instance)
        if st is None or binding.result_refusal(st, rec) is not None:
            self.results_ignored += 1
            return None, None
        pending = st.pending.pop(rec.call_id)
        st.mark(binding.answered(rec.call_id))
        path = rec.path or pending.paths[0]
        if rec.error is not None:
            error: str | None = rec.error
        elif path not in pending.paths:
            error = f"activity chose {path!r}, which is not one of {pending.paths}"
        else:
            error = path_problem(path, rec.value)
        if error is None:
            write_path(st.state, path, rec.value)
        else:
            st.state.setdefault("errors", {})[rec.call_id] = error
        plan_graph.mark(st.plan, rec.call_id, ok=error is None, wrote=path)
        nxt, done = self._settle(st)
        return nxt, done

    def take_launched(self, instance: str) -> list[dict[str, Any]]:
        """The lazy plan's calls the last result or deadline started (to publish with it)."""
        return self._launched.pop(instance, [])

    def _settle(self, st: InstanceState) -> tuple[Instance | None, DoneRecord | None]:
        if self.lazy and st.plan and st.status == "pending" and not st.pending:
            run, done = lazy.progress(self.spec, st, self.timeout)
            if run:
                self._launched[st.instance] = run
        else:
            if not self.lazy and st.status == "pending":
                # Eager: the steps of this turn that waited for what just came in.
                run = _start(st, self.timeout)
                if run:
                    self._launched[st.instance] = run
            done = _settled(self.spec, st)
        self._put(st)
        return self.next_turn(st), done

    def expire(
        self,
        now: float,
        owns: Callable[[int], bool] = lambda _: True,
        only: list[str] | None = None,
    ) -> list[tuple[Instance | None, DoneRecord | None]]:
        """Fails awaited calls past their deadline (of owned partitions only: a moved
        workflow is its new owner's), and forgets workflows ended `retention_s` ago. Reads
        only the states `due`, or `only` those (a rehearsal has no index of its own)."""
        out = []
        for name in self.due(now, owns) if only is None else only:
            if forget_retired(self.store, self.index, name, now, owns):
                continue
            st = self.store.get(name)
            if st is None or not owns(st.partition):
                self.index.drop(name)
                continue
            if st.ended is not None and not st.outbox and st.ended.at < now - self.retention_s:
                self.store.delete(st.instance, st.partition)
                self.index.drop(name)
                continue
            late = [cid for cid, p in st.pending.items() if p.deadline < now]
            for cid in late:
                st.pending.pop(cid)
                st.state.setdefault("errors", {})[cid] = "timed out waiting for the result"
                plan_graph.mark(st.plan, cid, ok=False)
                self.expired += 1
            if late:
                out.append(self._settle(st))
            else:
                self.index.update(st)  # due by an older deadline or end: next time is later
        return out

    def on_approval(
        self, rec: ApprovalRecord, owed: list[Outgoing] | None = None
    ) -> tuple[list[dict[str, Any]], DoneRecord | None]:
        """A proposal's answer: its calls to run now, or the end of the workflow. One that
        names another proposal is ignored (the caller refuses it first: `refusal`)."""
        st = self.store.get(rec.instance)
        if st is None or binding.approval_refusal(st, rec) is not None:
            self.results_ignored += 1
            return [], None
        st.mark(binding.approved(rec.proposal_id))
        if owed is not None:
            st.owe(owed, self.owner)
        if not rec.approve:
            done = lazy.reject(self.spec, st, rec.reason or "proposal rejected")
            self._put(st)
            return [], done
        run, finished = lazy.approve(self.spec, st, self.timeout)
        self._put(st)
        return run, finished


def _eager(
    spec: AgentSpec,
    st: InstanceState,
    inst: Instance,
    calls: list[tuple[str, Call]],
    first_time: bool,
    timeout: float,
    reviews: dict[str, str] | None = None,
) -> TurnEffects:
    """Planning is execution: latent steps answered in this generation are written,
    activities run now (or, held, when what they read is in: each keeps its gate verdict
    of `reviews`); the turn's steps join the instance's plan, shown next turn."""
    out = TurnEffects()
    awaited = False
    for _, call in calls:
        tool = spec.tool(call.tool)
        if tool is None:
            continue  # NoAction: nothing to run, nothing to await
        if tool.kind == "latent":
            # The validator admits a latent path only when it names one.
            if call.output_path and first_time:
                write_path(st.state, call.output_path.strip(), call.arguments)
            continue
        awaited = awaited or bool(call.output_path)
    if spec.plan is None:
        # One-shot: no call awaits anything (the spec refuses awaited tools without a
        # plan), so nothing can wait for another call: all run now.
        out.run = [cid for cid, c in calls if (t := spec.tool(c.tool)) and t.kind != "latent"]
    elif first_time:
        # A step reading what another step of this answer awaits waits for it.
        steps = plan_graph.steps_of(spec, calls, "approved", inst.turn)
        for step in steps:
            if step.kind == "latent":  # answered in this very generation
                step.status, step.wrote = "done", step.output
        st.plan = [*st.plan, *steps]
        out.run = [step.call_id for step in plan_graph.advance(st.plan, st.state, st.counts)]
        for step in steps:
            if step.call_id in out.run and step.output:
                st.pending[step.call_id] = _pending(step, timeout)
            elif step.status == "approved" and reviews and step.call_id in reviews:
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
        out.done = _maybe_done(spec, st, awaited)
    return out


def _stopped(spec: AgentSpec, st: InstanceState, calls: list[tuple[str, Call]]) -> TurnEffects:
    """A finish advisor voted stop: the workflow ends, whatever is still awaited no longer
    matters, and this answer's calls are not run (each recorded as `stopped`)."""
    st.pending = {}
    out = TurnEffects(trace=list(st.trace))
    out.done = _finish(st, "stopped", "a finish advisor voted stop")
    why = "a finish advisor voted stop in this answer: the workflow ended, unrun"
    out.dropped = {cid: ("stopped", why) for cid, c in calls if lazy.is_step(spec, c)}
    return out


def _pending(step: plan_graph.Step, timeout: float) -> Pending:
    assert step.output is not None
    return Pending(
        tool=step.tool,
        paths=alternatives(step.output),
        deadline=time.time() + timeout,
        turn=step.turn,
    )


def _start(st: InstanceState, timeout: float) -> list[dict[str, Any]]:
    """An eager turn's steps whose producers just finished: those that start now (their
    calls, to publish), awaited by the instance; the others stay waiting or are skipped."""
    run = []
    for step in plan_graph.advance(st.plan, st.state, st.counts):
        if step.kind == "activity":
            run.append(step.call)
            if step.output:
                st.pending[step.call_id] = _pending(step, timeout)
    return run


def _maybe_done(spec: AgentSpec, st: InstanceState, awaited: bool) -> DoneRecord | None:
    """A turn that left nothing pending: the workflow ends, or is ready for its next."""
    if spec.plan is None:
        st.status = "done"
        return None  # single-turn: nothing more to report than the calls themselves
    reason: tuple[str, str] | None = None
    if not awaited:
        reason = ("done", "the model made no more awaited calls")
    elif st.turn >= spec.plan.max_turns:
        reason = ("turn_limit", f"turn limit {spec.plan.max_turns} reached")
    if reason is None:
        st.status = "ready"
        return None
    return _finish(st, *reason)


def _settled(spec: AgentSpec, st: InstanceState) -> DoneRecord | None:
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


def _finish_says_stop(spec: AgentSpec, opinions: list[Opinion]) -> bool:
    """The finish advisors' say on stopping: the prompt tells them to score the options
    "stop" and "continue"; the loop stops when "stop" leads with at least 50."""
    votes = []
    for op in opinions:
        advisor = spec.advisor(op.advisor)
        scores, _ = parse_votes(op.votes_raw)
        if advisor and advisor.on == "finish" and scores and op.error is None:
            votes.append(_Vote(op.advisor, advisor.weight, scores))
    if not votes:
        return False
    council = aggregate(votes)
    return council.distribution.get("stop", 0.0) >= max(
        0.5, council.distribution.get("continue", 0.0)
    )
