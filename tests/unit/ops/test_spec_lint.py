"""`stream check`'s spec lint: each spec that loads but cannot mean what it says gets one
line, a refusal or a warning; the examples pass without either."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from instanced_stream.core.spec import AgentSpec, load_spec
from instanced_stream.errors import StreamError
from instanced_stream.ops.check import spec_lines
from instanced_stream.ops.spec_lint import lint_spec

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"

_TOOL = {
    "name": "route",
    "description": "route it",
    "paths": ["†state.route"],
    "parameters": {"type": "object", "properties": {"queue": {"type": "string"}}},
}


def _spec(**extra: Any) -> AgentSpec:
    return AgentSpec.model_validate(
        {"name": "s", "instructions": "do", "tools": [_TOOL], "plan": {"mode": "eager"}, **extra}
    )


def _advisor(**extra: Any) -> dict[str, Any]:
    return {"id": "critic", "role": "r", "on": "request", "schema": {"type": "object"}, **extra}


@pytest.mark.parametrize(
    "path", sorted(EXAMPLES.rglob("*.yaml")), ids=lambda p: f"{p.parent.name}/{p.name}"
)
def test_the_examples_lint_clean(path: Path) -> None:
    lint = lint_spec(load_spec(path))
    assert lint.refused == [] and lint.warnings == []


def test_an_advisor_without_a_schema_is_warned_of() -> None:
    bare = {k: v for k, v in _advisor().items() if k != "schema"}
    lint = lint_spec(_spec(advisors=[bare]))
    assert lint.refused == []
    (line,) = lint.warnings
    assert "'critic' has no schema" in line
    assert lint_spec(_spec(advisors=[_advisor()])).warnings == []


def test_an_advisor_scope_on_a_field_nothing_writes_is_warned_of() -> None:
    lint = lint_spec(_spec(advisors=[_advisor(scopes=["†state.history", "†state.route.q"])]))
    (line,) = lint.warnings
    assert "†state.history" in line and "no tool writes" in line and "route" in line


def test_an_advisor_scope_outside_input_and_state_is_warned_of() -> None:
    (line,) = lint_spec(_spec(advisors=[_advisor(scopes=["state.route"])])).warnings
    assert "'state.route' names no message" in line


def test_a_scope_on_state_from_producers_cannot_be_told_and_passes() -> None:
    spec = _spec(advisors=[_advisor(scopes=["†state.history"])], accept_state_input=True)
    assert lint_spec(spec).warnings == []


def test_a_tool_path_without_the_dagger_is_refused_in_one_line() -> None:
    spec = _spec(tools=[{**_TOOL, "paths": ["state.route"]}])
    (line,) = lint_spec(spec).refused
    assert "'state.route' is not a †state path" in line
    with pytest.raises(StreamError, match="bad_output_path"):
        spec_lines(spec)


def test_a_plan_naming_an_undeclared_tool_is_warned_of() -> None:
    plan = {"mode": "eager", "steps": ["lookupCustomer first", "then route() by queue"]}
    lines = spec_lines(_spec(plan=plan))
    assert lines == [
        "warning: the plan names 'lookupCustomer', which the spec does not declare as a "
        "tool (tools: route)"
    ]
