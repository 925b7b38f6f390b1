"""What an instance's answer decides, free text left out: the notion `stream eval` and
the live shadow sample (`instanced_stream.runtime.quality.shadow`) compare answers by.

For every call: its tool, and those arguments whose schema is an enum, a boolean, a
number or an integer (`moderateComment` with `decision: reject`; its `reason` is prose
and ignored). Two answers agree when their decisions are equal as sets.
"""

from __future__ import annotations

import orjson

from instanced_stream.core.messages import Call
from instanced_stream.core.spec import AgentSpec, Tool

__all__ = ["Decision", "deciding", "decision_of"]

_DECIDING = {"boolean", "integer", "number"}

Decision = frozenset[tuple[str, str, str]]


def deciding(tool: Tool) -> set[str]:
    """The arguments of `tool` that decide something (not prose)."""
    props = tool.parameters.get("properties", {})
    return {
        name
        for name, schema in props.items()
        if isinstance(schema, dict) and ("enum" in schema or schema.get("type") in _DECIDING)
    }


def decision_of(calls: list[Call], spec: AgentSpec) -> Decision:
    keys_of = {t.name: deciding(t) for t in spec.tools}
    out = set()
    for call in calls:
        keys = keys_of.get(call.tool, set())
        args = {k: v for k, v in call.arguments.items() if k in keys}
        if not args:
            out.add((call.tool, "", ""))
        for key, value in args.items():
            out.add((call.tool, key, orjson.dumps(value).decode()))
    return frozenset(out)
