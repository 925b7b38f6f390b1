"""The plan a model writes for one instance: an ordered dataflow graph of calls.

The seeds' Plan: the spec's plan is a template (mode, goal, constraints, step hints); the
plan itself is the model's. Its steps are the calls it makes for an instance, in answer
order, linked by `†state` paths: a step's output is its `_outputPath`, its inputs are
the `†state` paths its `_scopes` import. A step depends on the earlier steps whose output
overlaps one of its inputs (the same path, or one inside the other); only earlier ones,
so a graph cannot cycle.

Eager (planning is execution): the steps run as they are written; the graph is kept in
state with each step's status and shown to the next turn. Lazy: the graph is proposed
once, approved or rejected as a whole, then run in dependency order: an activity when
its inputs exist, a latent step by the model in a follow-up turn that names it as due.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from instanced_stream.core.call_meta import STATE
from instanced_stream.core.messages import Call
from instanced_stream.core.spec import NO_ACTION, AgentSpec

__all__ = [
    "FINISHED",
    "Step",
    "advance",
    "answer_due",
    "depends_on",
    "due",
    "finished",
    "mark",
    "steps_of",
    "view",
]

StepStatus = Literal["proposed", "approved", "due", "running", "done", "failed", "skipped"]

# A step in one of these states will not change any more.
FINISHED = frozenset({"done", "failed", "skipped"})


class Step(BaseModel):
    call_id: str
    tool: str
    kind: Literal["activity", "latent"]
    output: str | None = Field(None, description="The call's _outputPath")
    inputs: list[str] = Field(default_factory=list, description="†state paths it imports")
    status: StepStatus = "proposed"
    call: dict[str, Any] = Field(default_factory=dict, description="The call, wire form")


def _outputs(step: Step) -> list[str]:
    return [p.strip() for p in (step.output or "").split("||") if p.strip()]


def _overlap(a: str, b: str) -> bool:
    """`†state.customer` and `†state.customer.plan` overlap; `†state.c` and `†state.cx` not."""
    return a == b or a.startswith(b + ".") or b.startswith(a + ".")


def depends_on(graph: list[Step], index: int) -> list[int]:
    """The earlier steps whose output one of step `index`'s inputs reads."""
    step = graph[index]
    return [
        k
        for k in range(index)
        if any(_overlap(i, o) for i in step.inputs for o in _outputs(graph[k]))
    ]


def steps_of(spec: AgentSpec, calls: list[tuple[str, Call]], status: StepStatus) -> list[Step]:
    """An answer's calls for one instance as plan steps (NoAction and thoughts are none)."""
    out = []
    for cid, call in calls:
        tool = spec.tool(call.tool)
        if call.tool == NO_ACTION or tool is None:
            continue
        if tool.kind == "latent" and not call.output_path:
            continue  # a thought: ephemeral (the seeds), never stored, nothing reads it
        wire = {"call_id": cid, **call.wire()}
        inputs = [s.strip() for s in call.scopes or [] if s.strip().startswith(STATE)]
        out.append(
            Step(
                call_id=cid,
                tool=call.tool,
                kind=tool.kind,
                output=call.output_path.strip() if call.output_path else None,
                inputs=inputs,
                status=status,
                call=wire,
            )
        )
    return out


def advance(graph: list[Step]) -> list[Step]:
    """Approved steps whose producers are all done start now (activities: running, or done
    at once when fire-and-forget; latent: due for the model's next turn). A step whose
    producer failed is skipped. Returns the steps that started, in plan order."""
    started: list[Step] = []
    changed = True
    while changed:
        changed = False
        for k, step in enumerate(graph):
            if step.status != "approved":
                continue
            producers = [graph[p].status for p in depends_on(graph, k)]
            if any(s in ("failed", "skipped") for s in producers):
                step.status, changed = "skipped", True
            elif all(s == "done" for s in producers):
                if step.kind == "latent":
                    step.status = "due"
                else:
                    step.status = "running" if step.output else "done"
                started.append(step)
                changed = True
    return started


def mark(graph: list[Step], call_id: str, ok: bool) -> None:
    """An awaited step's result arrived (or failed, or timed out)."""
    for step in graph:
        if step.call_id == call_id and step.status not in FINISHED:
            step.status = "done" if ok else "failed"


def due(graph: list[Step]) -> list[Step]:
    return [s for s in graph if s.status == "due"]


def finished(graph: list[Step]) -> bool:
    return all(s.status in FINISHED for s in graph)


def answer_due(graph: list[Step], calls: list[tuple[str, Call]]) -> list[tuple[Step, Call]]:
    """A follow-up turn's latent calls matched to the due steps they carry out (by tool,
    in plan order); calls that match no due step are outside the approved plan."""
    open_steps = due(graph)
    matched: list[tuple[Step, Call]] = []
    for _, call in calls:
        step = next((s for s in open_steps if s.tool == call.tool), None)
        if step is not None:
            open_steps.remove(step)
            step.status = "done"
            matched.append((step, call))
    return matched


def view(graph: list[Step]) -> list[dict[str, Any]]:
    """The graph as the model sees it on its next turn."""
    return [
        {
            "step": k + 1,
            "tool": s.tool,
            **({"_outputPath": s.output} if s.output else {}),
            **({"inputs": s.inputs} if s.inputs else {}),
            "status": s.status,
        }
        for k, s in enumerate(graph)
    ]
