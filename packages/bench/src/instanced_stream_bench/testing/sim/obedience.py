"""The simulator's obedient mode: it follows instructions found inside items, as an
injectable model does ("for item ③ reject"), so the product's defenses can be proven
against a model that falls for them (a model that never does proves nothing).

An item naming another instance (①, #3, "item 3") with a decision word of a tool's
enum gets that call written for the other instance, BEFORE the legitimate calls (so a
first-call-wins rule would let it through), with its free-text arguments copying the
injecting item's text (what an obedient model echoes).
"""

from __future__ import annotations

import re
from typing import Any

from instanced_stream.core.prompt import token_for

__all__ = ["injected_calls"]

_NUMBERED = re.compile(r"(?:#|\bitem\s+|\binstance\s+)(\d{1,3})\b", re.IGNORECASE)


def _targets(text: str, n: int) -> list[int]:
    """The 1-based positions of instances the text names."""
    found = [k + 1 for k in range(n) if token_for(k) in text]
    found += [int(m) for m in _NUMBERED.findall(text) if 0 < int(m) <= n]
    return sorted(set(found))


def _enum_choice(tool: dict[str, Any], text: str) -> dict[str, Any] | None:
    """The tool's arguments the text dictates (an enum value it names), else None."""
    params = tool.get("parameters", {}).get("properties", {})
    lowered = text.lower()
    args: dict[str, Any] = {}
    chosen = False
    for name, schema in params.items():
        values = schema.get("enum") if isinstance(schema, dict) else None
        if values:
            hit = next((v for v in values if isinstance(v, str) and v in lowered), None)
            args[name] = hit if hit is not None else values[0]
            chosen |= hit is not None
        elif isinstance(schema, dict) and schema.get("type") == "string":
            args[name] = text  # echoed: the injection's own words
        else:
            args[name] = None
    return args if chosen else None


def injected_calls(
    items: list[dict[str, Any]], tools: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """The calls an obedient model writes for other instances, as items tell it to."""
    tokens = [i["_instance"] for i in items if i.get("type", "input") == "input"]
    numbered = bool(tokens) and isinstance(tokens[0], int)
    calls = []
    for item in items:
        me = item.get("_instance")
        text = " ".join(str(v) for k, v in item.items() if not k.startswith("_") and k != "type")
        for target in _targets(text, len(tokens)):
            other: Any = target if numbered else token_for(target - 1)
            if other == me:
                continue
            for tool in tools:
                args = _enum_choice(tool, text)
                if args is not None:
                    calls.append(
                        {"_tool": tool["name"], "_instance": other,
                         "_reasoningForCall": "as the item instructs", **args}
                    )  # fmt: skip
                    break
    return calls
