"""The Idea Process (the Instancing seed): the record of a plan and its execution state
across all its instances, kept live.

The spec's plan is the template; each instance's plan is the model's graph of calls
(core/plan_graph.py). The Idea Process puts those graphs side by side: one node per step
as the instances' graphs name it (its tool and the `†state` path it writes: a step of
the same tool writing the same place is the same step of the plan, whichever instance
runs it), an edge where a step reads what another writes, and on each node how many
instances' steps wait, run, are done, failed or were skipped.

One partition's share is one record (`IdeaProcessRecord`), keyed by the plan's edition
and the input partition, written by that partition's unit in the transaction that
commits the state changes it counts (runtime/state/idea_tally.py): the counts are those
of the committed states, no more and no less. A reader sums the partitions' records
(`summed`). Counts only: per-instance rows stay in the state changelog, where
`stream process-idea --instance ID` reads one (`standing`).
"""

from __future__ import annotations

import hashlib
from collections import Counter
from typing import Any, Literal, NamedTuple

import orjson
from pydantic import BaseModel, ConfigDict, Field

from instanced_stream.core.plan_graph import Step, depends_on
from instanced_stream.core.spec import Plan

__all__ = [
    "BUCKETS",
    "Contribution",
    "IdeaNode",
    "IdeaProcessRecord",
    "StepCounts",
    "bucket_of",
    "contribution",
    "contribution_of",
    "current",
    "edition_of",
    "node_id",
    "summed",
]

Bucket = Literal["waiting", "running", "done", "failed", "skipped"]
BUCKETS: tuple[Bucket, ...] = ("waiting", "running", "done", "failed", "skipped")

# A step's status (plan_graph.StepStatus) as the Idea Process counts it: proposed and
# approved steps wait for their inputs or an approval; a due latent step waits for the
# model's answer on the instance's next turn, which is running it, as an awaited
# activity's worker runs it.
_BUCKET: dict[str, Bucket] = {
    "proposed": "waiting",
    "approved": "waiting",
    "due": "running",
    "running": "running",
    "done": "done",
    "failed": "failed",
    "skipped": "skipped",
}

# Nodes one record names at most: a model inventing a new output path per instance
# would otherwise grow the record past the broker's limit. The rest are counted
# together, on one node of their own.
MAX_NODES = 200
OTHER = "(other steps)"


def bucket_of(status: str) -> Bucket:
    return _BUCKET.get(status, "waiting")


def node_id(step: Step) -> str:
    """The plan's step an instance's step is: its tool, and where it writes."""
    return f"{step.tool} → {step.output}" if step.output else step.tool


def edition_of(plan: Plan) -> str:
    """The plan's edition: a digest of the template itself, the same on every processor
    and after a restart, changed by any change of the plan (a live spec's new plan)."""
    text = orjson.dumps(plan.model_dump(mode="json"), option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(text).hexdigest()[:12]


class StepCounts(BaseModel):
    model_config = ConfigDict(frozen=True)

    waiting: int = 0
    running: int = 0
    done: int = 0
    failed: int = 0
    skipped: int = 0


class IdeaNode(BaseModel):
    model_config = ConfigDict(frozen=True)

    id: str = Field(description="The step: its tool, and the †state path it writes")
    tool: str
    kind: Literal["activity", "latent", "other"]
    output: str | None = Field(None, description="Its _outputPath (a branch: `a || b`)")
    reads: list[str] = Field(
        default_factory=list, description="The nodes whose output it reads (its edges)"
    )
    counts: StepCounts = Field(description="Instances' steps at this node, by where they are")
    turn: int = Field(
        1, description="The earliest turn an instance counted here wrote it at (the page's column)"
    )


class IdeaProcessRecord(BaseModel):
    """One input partition's share of a plan's Idea Process: the plan's graph across the
    partition's instances, and how many of their steps stand where. Keyed
    `<edition>/<partition>` on the compacted Idea Process topic; the whole is the sum of
    the partitions' latest records."""

    model_config = ConfigDict(frozen=True)

    type: Literal["idea_process"] = "idea_process"
    edition: str = Field(description="The plan's edition (a digest of the spec's plan)")
    goal: str | None = Field(None, description="The plan's goal")
    mode: Literal["eager", "lazy"]
    partition: int = Field(description="The input partition counted (-1: a sum of them all)")
    instances: int = Field(description="Instances whose state is counted")
    by_status: dict[str, int] = Field(
        default_factory=dict, description="Those instances by their workflow's status"
    )
    nodes: list[IdeaNode] = Field(default_factory=list)
    at: float = Field(description="Unix time of the commit that wrote it")


class _NodeShape(NamedTuple):
    tool: str
    kind: str
    output: str | None


class Contribution(NamedTuple):
    """One instance's share of its partition's record."""

    status: str
    steps: tuple[tuple[str, Bucket], ...]  # (node, bucket) per step of its plan
    edges: frozenset[tuple[str, str]]  # (reader node, producer node)
    turns: tuple[tuple[str, int], ...]  # (node, the turn that wrote the step) per step
    shapes: tuple[tuple[str, _NodeShape], ...]


def contribution(status: str, graph: list[Step]) -> Contribution:
    """An instance's share: its workflow's status and its plan's steps."""
    ids = [node_id(s) for s in graph]
    edges = frozenset(
        (ids[k], ids[p])
        for k in range(len(graph))
        for p in depends_on(graph, k)
        if ids[k] != ids[p]
    )
    return Contribution(
        status=status,
        steps=tuple((ids[k], bucket_of(s.status)) for k, s in enumerate(graph)),
        edges=edges,
        turns=tuple((ids[k], s.turn) for k, s in enumerate(graph)),
        shapes=tuple((ids[k], _NodeShape(s.tool, s.kind, s.output)) for k, s in enumerate(graph)),
    )


def contribution_of(raw: bytes) -> Contribution:
    """An instance's share from its state as stored (the changelog record's JSON): only its
    status and its plan are read."""
    value: dict[str, Any] = orjson.loads(raw)
    graph = [Step.model_validate(s) for s in value.get("plan") or []]
    return contribution(str(value.get("status", "new")), graph)


def summed(records: list[IdeaProcessRecord]) -> IdeaProcessRecord:
    """The partitions' records of one edition as one (partition -1)."""
    if not records:
        raise ValueError("nothing to sum")
    first = records[0]
    status: Counter[str] = Counter()
    counts: dict[str, Counter[str]] = {}
    shapes: dict[str, IdeaNode] = {}
    reads: dict[str, set[str]] = {}
    turns: dict[str, int] = {}
    for rec in records:
        status.update(rec.by_status)
        for node in rec.nodes:
            counts.setdefault(node.id, Counter()).update(node.counts.model_dump())
            shapes.setdefault(node.id, node)
            reads.setdefault(node.id, set()).update(node.reads)
            turns[node.id] = min(turns.get(node.id, node.turn), node.turn)
    nodes = [
        shapes[n].model_copy(update={"reads": sorted(reads[n]), "counts": StepCounts(**counts[n])})
        for n in sorted(shapes, key=lambda n: list(shapes).index(n))
    ]
    return IdeaProcessRecord(
        edition=first.edition,
        goal=first.goal,
        mode=first.mode,
        partition=-1,
        instances=sum(r.instances for r in records),
        by_status=dict(status),
        nodes=nodes,
        at=max(r.at for r in records),
    )


def current(records: list[IdeaProcessRecord]) -> list[IdeaProcessRecord]:
    """The Idea Process as it stands, from each key's latest record: per partition its
    newest record (a partition counts its states under the plan it runs now; an older
    edition's record of it is history), summed per edition, the newest edition first."""
    newest: dict[int, IdeaProcessRecord] = {}
    for rec in records:
        if rec.partition not in newest or rec.at > newest[rec.partition].at:
            newest[rec.partition] = rec
    editions: dict[str, list[IdeaProcessRecord]] = {}
    for rec in newest.values():
        editions.setdefault(rec.edition, []).append(rec)
    return sorted((summed(e) for e in editions.values()), key=lambda r: -r.at)
