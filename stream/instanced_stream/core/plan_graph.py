"""The plan a model writes for one instance: a dataflow graph of calls, run in the
graph's order whatever order the answer lists them in.

The seeds' Plan: the spec's plan is a template (mode, goal, constraints, step hints); the
plan itself is the model's. Its steps are the calls it makes for an instance, linked by
`†state` paths: a step's output is its `_outputPath`, its inputs are the `†state` paths
its `_scopes` import. A step depends on every other step of its turn whose output
overlaps one of its inputs (the same path, or one inside the other), wherever either is
written in the answer: a model may list a reader before its producer. A graph with a
cycle, or with a step reading a path that no step writes and the state lacks, is refused
(`problem`): the model is asked again with the reason.

A step runs only when every step it reads is finished: eager activities at once when they
read nothing awaited, else when the result is in; a latent step answered in the answer
that reads an awaited path waits too, and is answered again by the model, on a later
turn that shows it as due, once what it reads exists (its first answer was a guess).
Lazy: the graph is proposed once, approved or rejected as a whole, then run the same way.

Branches: a producer whose `_outputPath` is `†state.urgent || †state.routine` writes one
of them. A step that reads only the branch not taken never runs: it is skipped, and so
is every step that reads its output (`skipped_branch` counts them). A step reading a
producer that failed (an error result, a deadline) is skipped too (`skipped_input`
counts them). A latent producer's branch collapses to one path as the model writes it
(`collapse`: the seeds' update for the eager turn), and its readers follow the same rule.
When a step starts, each input a step of its graph writes is looked up in
the state as it is then: one missing is counted (`ran_on_missing_input`, which the rules
above keep at 0, whatever the order of the answer).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from instanced_stream.core.call_meta import STATE
from instanced_stream.core.messages import Call
from instanced_stream.core.spec import NO_ACTION, AgentSpec

__all__ = [
    "FINISHED",
    "RAN_ON_MISSING_INPUT",
    "SKIPPED_BRANCH",
    "SKIPPED_INPUT",
    "Step",
    "advance",
    "answer_due",
    "collapse",
    "depends_on",
    "due",
    "finished",
    "mark",
    "problem",
    "steps_of",
    "view",
]

StepStatus = Literal["proposed", "approved", "due", "running", "done", "failed", "skipped"]

# Per-instance counters the graph keeps (InstanceState.counts).
SKIPPED_BRANCH = "skipped_branch"
RAN_ON_MISSING_INPUT = "ran_on_missing_input"
SKIPPED_INPUT = "skipped_input"

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
    turn: int = Field(0, description="The turn that wrote it: a step reads only its own turn's")
    wrote: str | None = Field(None, description="The path its result went to (a branch: one)")
    skipped_for: Literal["branch", "failed_input"] | None = Field(
        None, description="Why it was skipped: its branch was not taken, or an input failed"
    )


def _outputs(step: Step) -> list[str]:
    return [p.strip() for p in (step.output or "").split("||") if p.strip()]


def _overlap(a: str, b: str) -> bool:
    """`†state.customer` and `†state.customer.plan` overlap; `†state.c` and `†state.cx` not."""
    return a == b or a.startswith(b + ".") or b.startswith(a + ".")


def _reads(step: Step, writer: Step) -> bool:
    return any(_overlap(i, o) for i in step.inputs for o in _outputs(writer))


def depends_on(graph: list[Step], index: int) -> list[int]:
    """The other steps of the same turn whose output one of step `index`'s inputs reads,
    wherever they stand in the answer (an earlier turn's steps wrote what the state it
    was shown holds; a step reading what it writes itself reads the value before it)."""
    step = graph[index]
    return [
        k
        for k, other in enumerate(graph)
        if k != index and other.turn == step.turn and _reads(step, other)
    ]


def _cycle(steps: list[Step]) -> list[int] | None:
    """A cycle of `steps` (indexes, the first repeated at the end), or None."""
    state: dict[int, int] = {}  # 1: on the current path, 2: finished

    def visit(k: int, path: list[int]) -> list[int] | None:
        state[k] = 1
        for p in depends_on(steps, k):
            if state.get(p) == 1:
                return [*path[path.index(p) :], k, p]  # p is on the path: it leads here
            if p not in state and (found := visit(p, [*path, k])) is not None:
                return found
        state[k] = 2
        return None

    for k in range(len(steps)):
        if k not in state and (found := visit(k, [])) is not None:
            return found
    return None


def problem(steps: list[Step], state: dict[str, Any]) -> str | None:
    """Why one instance's steps of one answer are no graph that can run, or None: a
    cycle, or a step reading a path no step of the answer writes and the state (the one
    the model was shown) lacks. Told to the model when it is asked again."""
    loop = _cycle(steps)
    if loop is not None:
        names = " -> ".join(steps[k].tool for k in loop)
        return (
            f"the plan has a cycle ({names}: each reads through _scopes what the next "
            "writes): nothing in it could start; scope each step to the paths it needs"
        )
    # A step reading what it writes itself reads the value before it (nothing, on an
    # empty state): harmless, and a model scopes a step to its own output often.
    written = {o for s in steps for o in _outputs(s)}
    for step in steps:
        for path in step.inputs:
            if not any(_overlap(path, o) for o in written) and not _exists(state, path):
                return (
                    f"{step.tool} reads {path} (its _scopes), which no call of this answer "
                    "writes and the state does not hold: it could never run; write the "
                    "step that produces it, or drop that scope"
                )
    return None


def _writers(producers: list[Step], path: str) -> list[Step]:
    return [p for p in producers if any(_overlap(path, o) for o in _outputs(p))]


def _wrote_on(producer: Step, path: str) -> bool:
    """Whether the finished `producer` wrote what `path` reads: a branch only where it
    went (one that wrote nothing, being skipped for its own branch, wrote nowhere)."""
    if producer.skipped_for == "branch":
        return False
    return producer.wrote is None or _overlap(producer.wrote, path)


def _untaken(producers: list[Step], step: Step) -> bool:
    """Whether `step` lies on a branch not taken: for one of its producers, nothing of
    what it reads from that producer was written (by it, or by another producer writing
    the same place). A step reading both alternatives of a branch reads the one taken."""
    for producer in producers:
        reads = [i for i in step.inputs if any(_overlap(i, o) for o in _outputs(producer))]
        if reads and not any(_wrote_on(w, i) for i in reads for w in _writers(producers, i)):
            return True
    return False


def _exists(state: dict[str, Any], path: str) -> bool:
    node: Any = state
    for key in [k for k in path.removeprefix(STATE).split(".") if k]:
        if not isinstance(node, dict) or key not in node:
            return False
        node = node[key]
    return node is not None


def _missing_input(graph: list[Step], step: Step, state: dict[str, Any]) -> bool:
    """Whether, for one of the steps of its graph that write what `step` reads (found here
    afresh, not from the dependencies that decided it may start), nothing `step` reads from
    it is in `state` (for an input and an output nested in one another, the deeper of the
    two is read). A writer skipped for its own branch wrote nothing, by design."""
    for writer in graph:
        if writer is step or writer.turn != step.turn or writer.skipped_for == "branch":
            continue
        written = [
            o if o.startswith(i) else i
            for i in step.inputs
            for o in _outputs(writer)
            if _overlap(i, o)
        ]
        if written and not any(_exists(state, w) for w in written):
            return True
    return False


def steps_of(
    spec: AgentSpec, calls: list[tuple[str, Call]], status: StepStatus, turn: int = 0
) -> list[Step]:
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
                turn=turn,
            )
        )
    return out


def advance(
    graph: list[Step], state: dict[str, Any] | None = None, counts: dict[str, int] | None = None
) -> list[Step]:
    """Approved steps whose producers (wherever the answer lists them) are all done start
    now (activities: running, or done at once when fire-and-forget; latent: due for the
    model's next turn). A step whose
    producer failed, or that reads only a branch its producer did not write, is skipped
    (and so are the steps reading it). Returns the steps that started, in plan order.
    `counts`: where `skipped_branch` and `ran_on_missing_input` are counted; `state`:
    the instance's state, read to check each starting step's inputs exist."""
    counts = {} if counts is None else counts
    started: list[Step] = []
    changed = True
    while changed:
        changed = False
        for k, step in enumerate(graph):
            if step.status != "approved":
                continue
            producers = [graph[p] for p in depends_on(graph, k)]
            failed = any(
                p.status == "failed" or (p.status == "skipped" and p.skipped_for != "branch")
                for p in producers
            )
            if not failed and not all(p.status in FINISHED for p in producers):
                continue  # a producer still runs: wait for it
            if failed or _untaken(producers, step):
                step.status, changed = "skipped", True
                step.skipped_for = "failed_input" if failed else "branch"
                why = SKIPPED_INPUT if failed else SKIPPED_BRANCH
                counts[why] = counts.get(why, 0) + 1
            else:
                if state is not None and _missing_input(graph, step, state):
                    counts[RAN_ON_MISSING_INPUT] = counts.get(RAN_ON_MISSING_INPUT, 0) + 1
                if step.kind == "latent":
                    step.status = "due"
                else:
                    step.status = "running" if step.output else "done"
                started.append(step)
                changed = True
    return started


def mark(graph: list[Step], call_id: str, ok: bool, wrote: str | None = None) -> None:
    """An awaited step's result arrived at `wrote` (or failed, or timed out)."""
    for step in graph:
        if step.call_id == call_id and step.status not in FINISHED:
            step.status = "done" if ok else "failed"
            step.wrote = wrote if ok else None


def collapse(step: Step, call: Call | None = None) -> str:
    """The one path a latent step's answer is written to. The seeds' update: on an eager
    turn planning is execution, so the model's reasoning collapses a latent call's
    `a || b` into one concrete path for that turn: the first it wrote (what reads only
    the others is skipped, as on an activity's branch). A later turn answering a due
    latent step (its input came in meanwhile) may name the alternative it takes in its
    own `_outputPath`; one it does not name (or the branch again) is the first."""
    paths = _outputs(step)
    chosen = (call.output_path or "").strip() if call is not None else ""
    return chosen if chosen in paths else paths[0]


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
            step.status, step.wrote = "done", collapse(step, call) if step.output else None
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
