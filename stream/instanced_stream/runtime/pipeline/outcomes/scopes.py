"""What a call imports through its `_scopes`: the `context` of its activity record.

Only from the call's own instance, plus globals (one instance never sees another's data);
an instance's input overrides the global inputs field by field (the Instancing protocol).
"""

from __future__ import annotations

from typing import Any

from instanced_stream.core.instance import Instance
from instanced_stream.core.spec import AgentSpec
from instanced_stream.core.state import read_path

__all__ = ["imported"]


def imported(
    spec: AgentSpec, inst: Instance, scopes: list[str] | None, state: dict[str, Any]
) -> list[dict[str, Any]]:
    """What a call imports through its `_scopes` (its record's `context`): only from its
    own instance, plus globals."""
    if not scopes:
        return []
    context: list[dict[str, Any]] = []
    # The instance's input over the global ones: a targeted input overrides a global
    # one field by field (the Instancing protocol), here as in the prompt.
    merged: dict[str, Any] = {}
    for message in spec.inputs:
        if message.type == "input":
            merged.update(message.model_dump(exclude={"type", "instance"}, exclude_none=True))
    if inst.payload.get("type", "input") == "input":
        merged.update({k: v for k, v in inst.payload.items() if k != "type"})
    if "input" in scopes:
        context.append({"type": "input", "_instance": inst.id, **merged})
    for scope in scopes:
        if scope.startswith("input.") and "input" not in scopes:
            value = read_path(merged, scope.removeprefix("input"))
            if value is not None:
                field_name = scope.split(".")[-1]
                context.append(
                    {"type": "input", "_instance": inst.id, "scope": scope, field_name: value}
                )
        if scope == "†state" or scope.startswith("†state."):
            value = read_path(state, scope)
            if value is not None:
                shown = value if scope == "†state" else {scope.split(".")[-1]: value}
                context.append(
                    {
                        "type": "state",
                        "_instance": inst.id,
                        "scope": scope,
                        **(shown if isinstance(shown, dict) else {"value": shown}),
                    }
                )
    return context
