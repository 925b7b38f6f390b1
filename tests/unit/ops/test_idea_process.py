"""`stream process-idea`'s text (ops/idea_process.py `render`): the plan, its instances by
status, and each step with what it reads and its counts, one line each."""

from __future__ import annotations

from instanced_stream.core.idea_process import IdeaNode, IdeaProcessRecord, StepCounts
from instanced_stream.ops.idea_process import render


def test_the_text_names_each_step_with_its_counts_and_what_it_reads() -> None:
    assess = IdeaNode(id="assess", tool="assess", kind="activity", counts=StepCounts(done=3))
    page = IdeaNode(
        id="page", tool="page", kind="activity", reads=["assess"],
        counts=StepCounts(done=1, skipped=2),
    )  # fmt: skip
    idea = IdeaProcessRecord(
        edition="abc", goal="triage", mode="eager", partition=-1, instances=3,
        by_status={"done": 3}, nodes=[assess, page], at=1.0,
    )  # fmt: skip
    lines = render(idea).splitlines()
    assert lines[0] == "plan abc (eager): triage"
    assert lines[1] == "instances: 3 done=3"
    assert (
        lines[3]
        == "  page [activity] (reads assess): waiting=0 running=0 done=1 failed=0 skipped=2"
    )
