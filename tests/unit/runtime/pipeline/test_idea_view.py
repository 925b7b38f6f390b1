"""What the live page is given of the Idea Process (runtime/pipeline/idea_view.py): each
key's latest record as the topic delivers them, a tombstone forgetting its key, a record
of another version left out, the partitions summed per edition."""

from __future__ import annotations

from instanced_stream.core.idea_process import IdeaNode, IdeaProcessRecord, StepCounts
from instanced_stream.runtime.pipeline.idea_view import IdeaView


def _share(partition: int, done: int) -> bytes:
    node = IdeaNode(id="lookup", tool="lookup", kind="activity", counts=StepCounts(done=done))
    return (
        IdeaProcessRecord(
            edition="e1", mode="eager", partition=partition, instances=done, nodes=[node], at=1.0
        )
        .model_dump_json()
        .encode()
    )


def test_the_page_gets_the_latest_share_of_each_partition_summed() -> None:
    view = IdeaView("unused:9092", "ideas")
    view.take(b"e1/0", _share(0, 1))
    view.take(b"e1/0", _share(0, 2))  # the newer share of partition 0 replaces the older
    view.take(b"e1/1", _share(1, 3))
    view.take(b"e1/2", b'{"type": "something else"}')  # another version's: not shown
    [plan] = view.plans()
    assert plan["instances"] == 5 and plan["nodes"][0]["counts"]["done"] == 5
    view.take(b"e1/1", None)  # a tombstone
    assert view.plans()[0]["instances"] == 2
