"""The spec's lint for `stream check`: what loads, but cannot mean what it says.

A spec that passes its own validation (core/spec.py) can still be one the seeds' reader
would not expect to run as written: a tool path the validator can never accept, an
advisor with nothing to say beyond its votes, a scope or a plan step naming what nothing
declares. Refusals are mistakes no answer can get round; warnings are likely mistakes
the processor still runs (a scope is a soft hint, a plan's text is read by the model).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from instanced_stream.core.call_meta import STATE
from instanced_stream.core.spec import CONSULT, NO_ACTION, AgentSpec

__all__ = ["SpecLint", "lint_spec"]

# A tool's name as a plan's text writes one: camelCase (lookupCustomer), or a word called
# like a function (route()). Plain words are the plan's prose, not names.
_CAMEL = re.compile(r"\b[a-z][a-z0-9]*(?:[A-Z][a-z0-9]*)+\b")
_CALLED = re.compile(r"\b([A-Za-z][A-Za-z0-9_]*)\(\)")


@dataclass(frozen=True)
class SpecLint:
    """What `stream check` says of a spec: refusals (exit 2) and warnings, one line each."""

    refused: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def lint_spec(spec: AgentSpec) -> SpecLint:
    """The spec's refusals and warnings."""
    lint = SpecLint()
    lint.refused.extend(_paths_without_dagger(spec))
    for advisor in spec.advisors:
        if "schema_" not in advisor.model_fields_set:
            lint.warnings.append(
                f"advisor {advisor.id!r} has no schema: its opinion can hold only votes; "
                "the seeds give every advisor the JSON Schema of its advice"
            )
    lint.warnings.extend(_unknown_scopes(spec))
    lint.warnings.extend(_plan_names(spec))
    return lint


def _paths_without_dagger(spec: AgentSpec) -> list[str]:
    # Every _outputPath is checked against †state (core/call_paths.py): a declared path
    # outside it makes every awaited call of its tool a refused one.
    return [
        f"tool {tool.name!r} path {path!r} is not a {STATE} path: write it {STATE}.<key> "
        "(every call that names it would be refused bad_output_path)"
        for tool in spec.tools
        for path in tool.paths
        if not (path == STATE or path.startswith(STATE + "."))
    ]


def _state_fields(spec: AgentSpec) -> set[str] | None:
    """The state's top fields the spec writes, or None when it cannot be told (state from
    producers, a tool free to write any †state key)."""
    if spec.accept_state_input or any(m.type == "state" for m in spec.inputs):
        return None
    fields: set[str] = set()
    for tool in spec.tools:
        if tool.kind == "latent" and not tool.paths:
            return None  # a latent call may name any †state.key
        for path in tool.paths:
            if path == STATE:
                return None  # a result merged into the whole state: any field
            fields.add(path.removeprefix(STATE + ".").split(".")[0])
    return fields


def _unknown_scopes(spec: AgentSpec) -> list[str]:
    known = _state_fields(spec)
    lines = []
    for advisor in spec.advisors:
        for scope in advisor.scopes:
            if scope == "input" or scope.startswith("input.") or scope == STATE:
                continue  # an item's fields are its producers' to choose
            if not scope.startswith(STATE + "."):
                lines.append(
                    f"advisor {advisor.id!r} scope {scope!r} names no message: a scope is "
                    f"input, input.<field>, {STATE} or {STATE}.<field>"
                )
                continue
            top = scope.removeprefix(STATE + ".").split(".")[0]
            if known is not None and top not in known:
                writers = ", ".join(sorted(known)) or "none"
                lines.append(
                    f"advisor {advisor.id!r} scope {scope!r}: no tool writes {STATE}.{top} "
                    f"and the spec takes no state input (written: {writers})"
                )
    return lines


def _plan_names(spec: AgentSpec) -> list[str]:
    if spec.plan is None:
        return []
    text = " ".join([spec.plan.goal or "", *spec.plan.constraints, *spec.plan.steps])
    named = set(_CAMEL.findall(text)) | set(_CALLED.findall(text))
    known = {t.name for t in spec.tools} | {a.id for a in spec.advisors} | {NO_ACTION, CONSULT}
    for tool in spec.tools:  # an argument or a field the plan mentions is no tool
        known |= set(tool.parameters.get("properties", {}))
        known |= {p.removeprefix(STATE + ".").split(".")[0] for p in tool.paths}
    return [
        f"the plan names {name!r}, which the spec does not declare as a tool "
        f"(tools: {', '.join(t.name for t in spec.tools)})"
        for name in sorted(named - known)
    ]
