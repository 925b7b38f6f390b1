"""Stateful workflows: awaited calls, instance state across turns, and plans.

A call with `_outputPath` is awaited: recorded as pending in its instance's state until
its result arrives (or its deadline passes). With a plan, an instance whose awaited calls
are all answered is ready for its next turn; its workflow ends when a turn makes no
awaited call, a `finish` advisor votes stop, or the turn limit is reached, and its final
state is published as a done record. A lazy plan stores each turn's calls as a proposal
and runs them only when approved.

Every method changes state at once (one get and one put, no await in between, so nothing
else runs meanwhile). The runtime makes each change on a `Change` of its stores (`over`):
the effects (records, next turn) are known before the change is stored, and the change is
stored, with its changelog records, once (runtime/state/transaction.py); the deadlines
follow what was stored (`indexed`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from instanced_stream.core import binding, eager, finish, lazy, plan_graph
from instanced_stream.core.binding import Unbound
from instanced_stream.core.eager import REVIEW, finish_says_stop, unrun_by_stop
from instanced_stream.core.expiry import DueIndex, forget_retired
from instanced_stream.core.instance import Instance
from instanced_stream.core.lazy import TurnEffects
from instanced_stream.core.live_spec import LiveSpec, SpecSource
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
    StateStore,
    Write,
    path_problem,
    write_path,
)
from instanced_stream.core.validate import Opinion

__all__ = ["REVIEW", "TurnEffects", "Workflow", "finish_says_stop", "unrun_by_stop"]


@dataclass(slots=True)
class _Shared:
    """What a workflow and its views over changes (`Workflow.over`) hold in common."""

    index: DueIndex
    launched: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    results_ignored: int = 0
    expired: int = 0


def _ended_done(out: TurnEffects, st: InstanceState) -> bool:
    """The turn ended the workflow as done (no more calls), not by a limit or a stop."""
    return out.done is not None and st.ended is not None and st.ended.status == "done"


class Workflow:
    def __init__(
        self,
        spec: AgentSpec | SpecSource,
        store: StateStore,
        pending_timeout_s: float,
        retention_s: float = 86_400.0,
        owner: str = "",
        *,
        shared: _Shared | None = None,
    ) -> None:
        # The processor's live spec, read at each use (a plain spec: one that never changes;
        # an edition: a batch's, `over`).
        self.live: SpecSource = LiveSpec(spec) if isinstance(spec, AgentSpec) else spec
        self.store = store
        self.owner = owner  # stamped on every state this workflow puts (`_put`)
        self.timeout = pending_timeout_s
        self.retention_s = retention_s
        # A view over a change (`over`) shares the deadlines and counters of the workflow
        # it came from, and leaves the deadlines to `indexed` once its change is stored.
        self._view = shared is not None
        self._shared = shared or _Shared(DueIndex(retention_s))  # kept by `_put`, deletions
        self.index = self._shared.index
        self._launched = self._shared.launched

    @property
    def results_ignored(self) -> int:
        return self._shared.results_ignored

    @results_ignored.setter
    def results_ignored(self, value: int) -> None:
        self._shared.results_ignored = value

    @property
    def expired(self) -> int:
        return self._shared.expired

    @property
    def spec(self) -> AgentSpec:
        return self.live.spec

    @property
    def iterative(self) -> bool:
        return self.spec.plan is not None

    @property
    def lazy(self) -> bool:
        return self.spec.plan is not None and self.spec.plan.mode == "lazy"

    def over(self, change: StateStore, spec: SpecSource | None = None) -> Workflow:
        """This workflow making its changes on `change` (a `Change` of its store): what a
        change does (its records, its next turn) is known before it is stored. `spec`: the
        edition to make them on (a batch's), else the live one."""
        source = self.live if spec is None else spec
        return Workflow(
            source, change, self.timeout, self.retention_s, self.owner, shared=self._shared
        )

    def indexed(self, stored: Iterable[Write]) -> None:
        """The writes of a change just stored: the deadlines follow them."""
        for write in stored:
            if write.state is None:
                self.index.drop(write.instance, write.partition)
            else:
                self.index.update(write.state)

    def admit(self, inst: Instance) -> Instance | None:
        """An input or state record arrives: it starts (or restarts) its instance's
        workflow, and the model sees the instance's state with it. None: this very record
        started the workflow before (redelivered after a crash) and its first turn was
        applied; that turn's records were staged with its state change and committed with
        it, so nothing is redone."""
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
        reviews: dict[str, str] | None = None,
    ) -> TurnEffects:
        """Applies a turn's answer to the instance's state (once, however often the batch
        is redone) and says which calls run now. `reviews`: the advice gate's verdicts by
        call id, kept with a step that waits for a result."""
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
        # The finish advisors are consulted where the loop decides whether this instance
        # stops (core/finish.py): a stop ends it; a continue keeps an answer of no call going.
        say = finish.say(self.spec, opinions, alone=batch.size == 1) if self.iterative else None
        when = finish.moment(self.spec, inst.turn, calls) if say is not None else None
        if say == "stop" and when is not None:
            out = eager.stopped(self.spec, st, calls)
        elif self.lazy:
            out = lazy.turn(self.spec, st, inst, calls, batch, first_time, self.timeout)
        else:
            out = eager.turn(self.spec, st, inst, calls, first_time, self.timeout, reviews)
        if say == "continue" and when == "no_call" and _ended_done(out, st):
            st.status, st.ended, out.done = "ready", None, None  # another turn, as it asked
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
        if not self._view:  # a view's change may yet not be stored: `indexed` follows it
            self.index.update(st)

    def due(
        self, now: float, owns: Callable[[int], bool] = lambda _: True
    ) -> list[tuple[str, int]]:
        """Owned instances past a deadline or their retention, with their partitions; they
        leave the index until put back (the index is built from the store on the first
        call, unless a restore indexed its partition first: `DueIndex.reindex`)."""
        if not self.index.built:
            self.index.rebuild(self.store.items(), self.store.retired())
        return self.index.due(now, owns)

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
                # Eager: the steps that waited for what just came in (a latent one among
                # them becomes due: the model answers it on the next turn).
                _, run = eager.advance(st, {}, self.timeout)
                if run:
                    self._launched[st.instance] = run
            done = eager.settled(self.spec, st)
        self._put(st)
        return self.next_turn(st), done

    def expire(
        self,
        now: float,
        owns: Callable[[int], bool] = lambda _: True,
    ) -> list[tuple[Instance | None, DoneRecord | None]]:
        """Fails awaited calls past their deadline (of owned partitions only: a moved
        workflow is its new owner's), and forgets workflows ended `retention_s` ago. Reads
        only the states `due`."""
        out = []
        for name, partition in self.due(now, owns):
            if forget_retired(self.store, self.index, name, partition, now, owns):
                continue
            st = self.store.get(name)
            if st is None or not owns(st.partition):
                continue  # gone, or moved: it left the index when it fell due
            if st.ended is not None and st.ended.at < now - self.retention_s:
                self.store.delete(st.instance, st.partition)
                continue
            late = [cid for cid, p in st.pending.items() if p.deadline < now]
            for cid in late:
                st.pending.pop(cid)
                st.state.setdefault("errors", {})[cid] = "timed out waiting for the result"
                plan_graph.mark(st.plan, cid, ok=False)
                self._shared.expired += 1
            if late:
                out.append(self._settle(st))
            else:
                self.index.update(st)  # due by an older deadline or end: next time is later
        return out

    def on_approval(self, rec: ApprovalRecord) -> tuple[list[dict[str, Any]], DoneRecord | None]:
        """A proposal's answer: its calls to run now, or the end of the workflow. One that
        names another proposal is ignored (the caller refuses it first: `refusal`)."""
        st = self.store.get(rec.instance)
        if st is None or binding.approval_refusal(st, rec) is not None:
            self.results_ignored += 1
            return [], None
        st.mark(binding.approved(rec.proposal_id))
        if not rec.approve:
            done = lazy.reject(self.spec, st, rec.reason or "proposal rejected")
            self._put(st)
            return [], done
        run, finished = lazy.approve(self.spec, st, self.timeout)
        self._put(st)
        return run, finished
