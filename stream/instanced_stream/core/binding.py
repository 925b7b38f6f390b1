"""What a result or an approval answers, and whether a result can be taken.

A result names its call (`call_id`, tool and turn), an approval the proposal
(`proposal_id` and turn). Anything that answers nothing pending is refused, never applied
to whatever happens to be pending when it is read (an old approval replayed onto a newer
proposal, a guessed `call_id`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

from instanced_stream.core.instance import Instance
from instanced_stream.core.messages import ApprovalRecord, ResultRecord
from instanced_stream.core.spec import AgentSpec, Tool
from instanced_stream.core.state import InstanceState, path_problem

__all__ = [
    "Unbound",
    "answered",
    "approval_refusal",
    "approved",
    "proposal_id",
    "result_problem",
    "result_refusal",
]


@dataclass(frozen=True, slots=True)
class Unbound:
    """Why a result or an approval answers nothing pending. `repeat`: it answered its
    call or proposal before (a redelivery, or the same record sent again): ignored and
    counted, as at-least-once delivery makes normal; anything else is refused with a dead
    letter (`unexpected_result`, `unexpected_approval`)."""

    reason: str
    repeat: bool = False


def proposal_id(inst: Instance) -> str:
    """Deterministic per input and turn: a redone batch proposes under the same id, a new
    input or a later turn under another, so an approval answers exactly one proposal."""
    src = inst.source
    return f"{src.topic}/{src.partition}/{src.offset}/t{inst.turn}/proposal"


def answered(call_id: str) -> str:
    """The trigger a result leaves in `InstanceState.applied`."""
    return f"result:{call_id}"


def approved(pid: str) -> str:
    """The trigger an approval (or a rejection) leaves in `InstanceState.applied`."""
    return f"approval:{pid}"


def result_refusal(st: InstanceState, rec: ResultRecord) -> Unbound | None:
    """None when `rec` answers a call `st` awaits now, at the turn that made it."""
    pending = st.pending.get(rec.call_id)
    if pending is None:
        if answered(rec.call_id) in st.applied:
            return Unbound(f"call {rec.call_id} was answered before", repeat=True)
        return Unbound(
            f"call {rec.call_id} is not awaited by {rec.instance!r} (status {st.status}, "
            f"turn {st.turn}; awaited: {sorted(st.pending) or 'nothing'})"
        )
    if pending.turn != rec.turn or pending.tool != rec.tool:
        return Unbound(
            f"call {rec.call_id} is {pending.tool} of turn {pending.turn}; the result "
            f"names {rec.tool} of turn {rec.turn}"
        )
    return None


def approval_refusal(st: InstanceState, rec: ApprovalRecord) -> Unbound | None:
    """None when `rec` names the proposal pending in `st` now (its id and turn)."""
    if approved(rec.proposal_id) in st.applied:
        return Unbound(f"proposal {rec.proposal_id} was answered before", repeat=True)
    if st.status != "awaiting_approval":
        return Unbound(
            f"{rec.instance!r} awaits no approval (status {st.status}); the approval names "
            f"proposal {rec.proposal_id} of turn {rec.turn}"
        )
    if rec.proposal_id != st.proposal_id or rec.turn != st.turn:
        return Unbound(
            f"the approval names proposal {rec.proposal_id} of turn {rec.turn}; the one "
            f"pending is {st.proposal_id} of turn {st.turn}"
        )
    return None


def result_problem(spec: AgentSpec, st: InstanceState, rec: ResultRecord) -> str | None:
    """Why an awaited call's result breaks its tool's `_output` schema or cannot be
    written where it goes (an object is the only thing †state itself takes), or None
    (also for results the workflow will ignore, and errors, which carry no value)."""
    pending = st.pending.get(rec.call_id)
    if pending is None or rec.error is not None:
        return None
    path = rec.path or pending.paths[0]
    if path in pending.paths and (problem := path_problem(path, rec.value)) is not None:
        return f"{pending.tool} result cannot be written: {problem}"
    tool = spec.tool(pending.tool)
    return None if tool is None else _output_error(tool, rec.value)


# Compiled `_output` validators, by the schema object they were built from (kept here, so
# its id stays its own): building one per result cost more than checking the result.
_OUTPUT_CHECKS: dict[int, tuple[dict[str, Any], Draft202012Validator]] = {}


def _output_error(tool: Tool, value: Any) -> str | None:
    if tool.output is None:
        return None
    known = _OUTPUT_CHECKS.get(id(tool.output))
    if known is None or known[0] is not tool.output:
        known = (tool.output, Draft202012Validator(tool.output))
        _OUTPUT_CHECKS[id(tool.output)] = known
    error = best_match(known[1].iter_errors(value))
    if error is None:
        return None
    where = "/".join(str(p) for p in error.absolute_path) or "(result)"
    return f"{tool.name} result breaks its _output schema at {where}: {error.message}"
