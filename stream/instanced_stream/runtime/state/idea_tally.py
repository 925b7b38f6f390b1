"""One partition's Idea Process counts (core/idea_process.py), kept exact: they follow
the committed states of the partition and nothing else.

The tally lives with the partition's store (`UnitStore.ideas`) and changes in two ways
only: a restore sets it from what it reads of the changelog (read_committed), and a
commit of the unit sets it from the changelog records that commit writes (`IdeaShare`,
the unit's hook). A change made in the store but not committed yet (a slot behind an
unfinished one waits for a later commit) is not counted before its commit; one whose
commit failed is never counted: the unit is dropped, and the restore that reopens the
partition reads what was committed.

`IdeaShare.staged` is asked, with the records of a commit about to begin, for the record
of the partition's counts after it; the record goes out in the same transaction, so the
Idea Process topic says what the changelog says, commit for commit.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable

from instanced_stream.core.idea_process import (
    MAX_NODES,
    OTHER,
    Contribution,
    IdeaNode,
    IdeaProcessRecord,
    StepCounts,
    contribution,
    contribution_of,
    edition_of,
)
from instanced_stream.core.spec import Plan
from instanced_stream.core.state import InstanceState
from instanced_stream.kafka.records import OutRecord

__all__ = ["IdeaShare", "IdeaTally", "idea_key", "share_of"]

_Changes = dict[str, Contribution | None]


def share_of(st: InstanceState) -> Contribution:
    return contribution(st.status, st.plan)


def idea_key(edition: str, partition: int) -> bytes:
    return f"{edition}/{partition}".encode()


class IdeaTally:
    """The committed states' shares of one partition, summed."""

    def __init__(self, counted: IdeaTally | None = None) -> None:
        """`counted`: a tally whose counters this one starts from (copied; its instances'
        shares are not: this one is only read, `after`)."""
        self._by: dict[str, Contribution] = {}
        # Equal shares kept once: every instance holds its share (to take it away when its
        # state changes), and most are alike (a finished plan's, step by step), so a share
        # costs a reference, not its tuples: 3,000 finished states cost 1,771 B each without.
        self._alike: dict[Contribution, Contribution] = {}
        self._steps: Counter[tuple[str, str]] = Counter()
        self._status: Counter[str] = Counter()
        self._edges: Counter[tuple[str, str]] = Counter()
        self._turns: Counter[tuple[str, int]] = Counter()
        self._shapes: dict[str, tuple[str, str, str | None]] = {}
        if counted is not None:
            self._steps, self._status = counted.steps(), Counter(counted.by_status())
            self._edges, self._turns = counted.edges(), counted.turns()
            self._shapes = counted.shapes()

    def steps(self) -> Counter[tuple[str, str]]:
        return Counter(self._steps)

    def by_status(self) -> dict[str, int]:
        return dict(self._status)

    def edges(self) -> Counter[tuple[str, str]]:
        return Counter(self._edges)

    def turns(self) -> Counter[tuple[str, int]]:
        return Counter(self._turns)

    def shapes(self) -> dict[str, tuple[str, str, str | None]]:
        return dict(self._shapes)

    def __len__(self) -> int:
        return len(self._by)

    def reset(self) -> None:
        self._by.clear()
        self._alike.clear()
        for held in (self._steps, self._status, self._edges, self._turns, self._shapes):
            held.clear()

    def set(self, instance: str, raw: bytes | None) -> None:
        """The committed state of `instance` is `raw` (None or empty: deleted)."""
        self.apply({instance: contribution_of(raw) if raw else None})

    def apply(self, changes: _Changes) -> None:
        for instance, share in changes.items():
            old = self._by.pop(instance, None)
            if old is not None:
                self.count(old, -1)
            if share is not None:
                share = self._alike.setdefault(share, share)
                self._by[instance] = share
                self.count(share, 1)

    def count(self, share: Contribution, sign: int) -> None:
        """Adds (1) or takes away (-1) one instance's share of the counters."""
        self._status[share.status] += sign
        for step in share.steps:
            self._steps[step] += sign
        for edge in share.edges:
            self._edges[edge] += sign
        for turn in share.turns:
            self._turns[turn] += sign
        for node, shape in share.shapes:
            self._shapes.setdefault(node, (shape.tool, shape.kind, shape.output))
        # what no instance counts any more is forgotten (a record names only live nodes)
        for counter in (self._status, self._steps, self._edges, self._turns):
            for key in [k for k, v in counter.items() if v <= 0]:
                del counter[key]

    def after(self, changes: _Changes) -> IdeaTally:
        """The tally these changes would make, this one unchanged (only its counters are
        copied: the changed instances' shares are looked up here)."""
        out = IdeaTally(self)
        for instance, share in changes.items():
            old = self._by.get(instance)
            if old is not None:
                out.count(old, -1)
            if share is not None:
                out.count(share, 1)
        return out

    def record(self, plan: Plan, partition: int, at: float | None = None) -> IdeaProcessRecord:
        """The partition's share of the plan's Idea Process, as the tally stands."""
        per_node: dict[str, Counter[str]] = {}
        for (node, bucket), n in self._steps.items():
            per_node.setdefault(node, Counter())[bucket] += n
        named = sorted(per_node, key=lambda n: list(self._shapes).index(n))
        kept, rest = named[:MAX_NODES], named[MAX_NODES:]
        first: dict[str, int] = {}
        for node, turn in self._turns:
            first[node] = min(first.get(node, turn), turn)
        nodes = []
        for node in kept:
            tool, kind, output = self._shapes[node]
            reads = sorted({p for r, p in self._edges if r == node and p in kept})
            nodes.append(
                IdeaNode(
                    id=node,
                    tool=tool,
                    kind="latent" if kind == "latent" else "activity",
                    output=output,
                    reads=reads,
                    counts=StepCounts(**per_node[node]),
                    turn=first.get(node, 1),
                )
            )
        if rest:
            other: Counter[str] = Counter()
            for node in rest:
                other.update(per_node[node])
            nodes.append(IdeaNode(id=OTHER, tool=OTHER, kind="other", counts=StepCounts(**other)))
        return IdeaProcessRecord(
            edition=edition_of(plan),
            goal=plan.goal,
            mode=plan.mode,
            partition=partition,
            instances=sum(self._status.values()),
            by_status=dict(self._status),
            nodes=nodes,
            at=time.time() if at is None else at,
        )


class IdeaShare:
    """The unit's hook (`Unit.annex`): with each commit, the partition's Idea Process
    record after it, when the commit changes a state of the partition."""

    def __init__(
        self,
        tally: IdeaTally,
        changelog: str,
        topic: str,
        partition: int,
        plan: Callable[[], Plan | None],
    ) -> None:
        self.tally, self.changelog, self.topic = tally, changelog, topic
        self.partition, self.plan = partition, plan
        self._pending: _Changes = {}
        self._sent: tuple[str, bytes] | None = None  # the edition and counts written last

    def staged(self, records: list[OutRecord]) -> list[OutRecord]:
        """The record to write with `records` (none: nothing it counts changed)."""
        self._pending = {}
        plan = self.plan()
        if plan is None:
            return []
        for rec in records:
            if rec.topic == self.changelog and rec.partition == self.partition and rec.key:
                self._pending[rec.key.decode()] = contribution_of(rec.value) if rec.value else None
        share = self.tally.after(self._pending).record(plan, self.partition)
        counted = share.model_dump_json(exclude={"at"}).encode()
        if self._sent == (share.edition, counted):
            return []
        self._sent = (share.edition, counted)
        value = share.model_dump_json().encode()
        return [
            OutRecord(
                self.topic, idea_key(share.edition, self.partition), value, None, self.partition
            )
        ]

    def committed(self) -> None:
        """The commit went through: its changes are counted."""
        self.tally.apply(self._pending)
        self._pending = {}
