"""The Idea Process's counting (core/idea_process.py): one node per step as the instances'
graphs name it, edges where a step reads another's output, counts by where steps stand;
partitions summed, the newest record of each partition taken."""

from __future__ import annotations

from instanced_stream.core.idea_process import (
    IdeaNode,
    IdeaProcessRecord,
    StepCounts,
    bucket_of,
    contribution,
    current,
    edition_of,
    node_id,
    summed,
)
from instanced_stream.core.plan_graph import Step
from instanced_stream.core.spec import Plan


def _step(
    tool: str, status: str, output: str | None = None, inputs: list[str] | None = None
) -> Step:
    return Step.model_validate(
        {
            "call_id": tool,
            "tool": tool,
            "kind": "activity",
            "output": output,
            "inputs": inputs or [],
            "status": status,
        }
    )


def _share(partition: int, done: int, edition: str = "e1", at: float = 1.0) -> IdeaProcessRecord:
    node = IdeaNode(id="lookup", tool="lookup", kind="activity", counts=StepCounts(done=done))
    return IdeaProcessRecord(
        edition=edition,
        mode="eager",
        partition=partition,
        instances=done,
        by_status={"done": done},
        nodes=[node],
        at=at,
    )


def test_every_step_status_has_its_bucket() -> None:
    assert [bucket_of(s) for s in ("proposed", "approved", "due", "running")] == [
        "waiting",
        "waiting",
        "running",
        "running",
    ]
    assert [bucket_of(s) for s in ("done", "failed", "skipped")] == ["done", "failed", "skipped"]


def test_a_share_names_nodes_by_tool_and_output_and_links_reader_to_producer() -> None:
    graph = [
        _step("page", "skipped", inputs=["†state.urgent"]),  # listed before its producer
        _step("assess", "done", output="†state.urgent || †state.routine"),
    ]
    share = contribution("done", graph)
    assess = node_id(graph[1])
    assert assess == "assess → †state.urgent || †state.routine"
    assert share.steps == (("page", "skipped"), (assess, "done"))
    assert share.edges == frozenset({("page", assess)})


def test_the_edition_follows_the_plan_and_nothing_else() -> None:
    eager = Plan.model_validate({"mode": "eager", "steps": ["a", "b"]})
    assert edition_of(eager) == edition_of(
        Plan.model_validate({"mode": "eager", "steps": ["a", "b"]})
    )
    assert edition_of(eager) != edition_of(
        Plan.model_validate({"mode": "lazy", "steps": ["a", "b"]})
    )


def test_partitions_are_summed_and_each_partition_counts_once() -> None:
    total = summed([_share(0, 2), _share(1, 3)])
    assert (total.partition, total.instances, total.nodes[0].counts.done) == (-1, 5, 5)
    # partition 0 moved to a new edition: its old record is history, not counted twice
    now = current([_share(0, 4, "e2", 2.0), _share(1, 3, "e1", 1.0), _share(0, 2, "e1", 1.0)])
    assert [(r.edition, r.instances) for r in now] == [("e2", 4), ("e1", 3)]
