"""A call's meta properties in the answer's schema: `_outputPath` and `_scopes`.

Nullable, because strict structured output wants every property. They are closed to
what the spec declares: as free strings a small model under grammar wrote prose into
them (every call refused, re-asked and split until the output caps), while the
validator refuses everything but these values anyway (`core/validate.py`).
"""

from __future__ import annotations

from typing import Any

from instanced_stream.core.spec import AgentSpec, Tool

__all__ = ["SCOPES", "STATE", "fire_and_forget", "planned", "readable", "state_meta"]

# The root of every state path (`†state.customer`), as the seeds write it.
STATE = "†state"

_NULL: dict[str, Any] = {"type": "null"}


def _scopes(names: list[str]) -> dict[str, Any]:
    """A `_scopes` list naming only `names` (each at most once, as a bound), or null."""
    listed = {"type": "array", "items": {"type": "string", "enum": names}}
    return {"anyOf": [listed | {"maxItems": len(names)}, _NULL]}


# Every spec's activities may import their own instance's input; in a stateless spec
# that is all a scope can name.
SCOPES: dict[str, Any] = {"_scopes": _scopes(["input"])}


def fire_and_forget(tool: Tool) -> bool:
    """An activity that declares neither paths nor `_output` (the spec's definition):
    nothing of it is kept, so its calls name no `_outputPath`. NoAction is one too."""
    return tool.kind == "activity" and not tool.paths and not tool.output


def readable(spec: AgentSpec) -> list[str]:
    """What a stateful spec's scopes may name: the input, the whole state, or a path a
    tool declares. Reading `†state` covers what a path-less tool wrote."""
    return ["input", STATE, *sorted({p for t in spec.tools for p in t.paths} - {STATE})]


def state_meta(tool: Tool, scopes: list[str], activity: bool) -> dict[str, Any]:
    """A stateful spec's meta properties for one tool. A tool with paths writes only
    there (an activity may offer them all as alternatives, for its result to choose);
    one without paths writes any †state key when it is latent or declares `_output`,
    and otherwise keeps nothing (a fire-and-forget activity, NoAction)."""
    if tool.paths:
        choices = [*tool.paths]
        if activity and len(tool.paths) > 1:
            choices.append(" || ".join(tool.paths))
        output: dict[str, Any] = {"anyOf": [{"type": "string", "enum": choices}, _NULL]}
    elif fire_and_forget(tool):
        output = _NULL
    else:
        output = {"anyOf": [{"type": "string"}, _NULL]}
    read = _scopes(scopes) if activity or tool.kind == "latent" else _NULL
    return {"_outputPath": output, "_scopes": read}


def planned(tool: Tool, meta: dict[str, Any]) -> dict[str, Any]:
    """A lazy plan's planning turn: a latent step with declared paths must say where its
    output goes (a latent step without one is a thought, which a plan has no use for)."""
    if tool.kind != "latent" or not tool.paths:
        return meta
    return {**meta, "_outputPath": {"type": "string", "enum": [*tool.paths]}}
