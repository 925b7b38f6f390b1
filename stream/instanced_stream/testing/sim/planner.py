"""The simulator's plans: what it calls for a stateful instance, turn by turn.

Eager (`plan_step`): fetch what the state still lacks and write latent notes in the same
answer, with the steps that read one branch of a fetch (they wait for it); once
everything is known, act. Lazy (`lazy_steps`): on the planning turn the
whole graph, latent steps without arguments, each step reading (`_scopes`) what earlier
steps write; on a follow-up turn, the steps the plan shows as due, answered.
"""

from __future__ import annotations

from typing import Any

from instanced_stream.core.state import read_path

__all__ = ["fill", "lazy_steps", "plan_step"]


def fill(schema: dict[str, Any], name: str, flagged: bool, why: str, terse: bool = False) -> Any:
    if "anyOf" in schema:
        branch: dict[str, Any] = next((s for s in schema["anyOf"] if s.get("type") != "null"), {})
        return fill(branch, name, flagged, why, terse)
    if "enum" in schema:
        options = list(schema["enum"])
        if {"approve", "reject"} <= set(options):
            return "reject" if flagged else "approve"
        return options[0] if flagged else options[-1]
    kind = schema.get("type")
    if kind == "string":
        if name == "message":
            return f"Removed: {why}." if terse else f"Your comment was removed: {why}."
        return why
    if kind in ("number", "integer"):
        return 1 if flagged else 0
    if kind == "boolean":
        return flagged
    if kind == "array":
        return []
    if kind == "object":
        props = schema.get("properties", {})
        return {k: fill(v, k, flagged, why, terse) for k, v in props.items()}
    return None


def plan_step(
    token: str, view: dict[str, Any], tools: list[dict[str, Any]], text: str
) -> list[dict[str, Any]]:
    """A stateful turn: fetch what the state still lacks (awaited calls and latent
    notes); once everything is known, act with the final tools and await nothing."""
    state = view["state"]

    def known(paths: list[str]) -> bool:
        return any(read_path(state, p) is not None for p in paths)

    calls: list[dict[str, Any]] = []
    awaited = [t for t in tools if t.get("paths") and t.get("kind") != "latent"]
    missing = [t for t in awaited if not known(t["paths"])]
    readers = _branch_readers(tools, awaited)
    if missing:
        for tool in missing:
            args = fill(tool.get("parameters", {}), "", False, "needed to decide")
            calls.append(
                {
                    "_tool": tool["name"],
                    "_instance": token,
                    "_reasoningForCall": "the state lacks this",
                    "_outputPath": " || ".join(tool["paths"]),
                    "_scopes": ["input"],
                    **(args if isinstance(args, dict) else {}),
                }
            )
        for tool in tools:
            if tool.get("kind") != "latent" or (tool.get("paths") and known(tool["paths"])):
                continue
            args = fill(tool.get("parameters", {}), "", False, f"notes: {text[:60]}")
            call = {
                "_tool": tool["name"],
                "_instance": token,
                "_reasoningForCall": "thinking it through",
                **(args if isinstance(args, dict) else {}),
            }
            if tool.get("paths"):
                call["_outputPath"] = tool["paths"][0]
            calls.append(call)
        # A step of one branch, in the same answer: it waits for the branch's writer.
        for name, path in readers.items():
            if any(path in t["paths"] for t in missing):
                args = fill(_tool_of(tools, name).get("parameters", {}), "", True, "paging")
                calls.append(
                    {
                        "_tool": name,
                        "_instance": token,
                        "_reasoningForCall": f"only if {path} is written",
                        "_scopes": [path],
                        **(args if isinstance(args, dict) else {}),
                    }
                )
        return calls
    urgent = bool(state.get("urgent")) or bool((state.get("customer") or {}).get("vip"))
    for tool in tools:
        if tool.get("kind") == "latent" and not tool.get("paths"):
            # a thought before acting: kept in the trace, never published
            calls.append(
                {
                    "_tool": tool["name"],
                    "_instance": token,
                    "_reasoningForCall": "weighing the state",
                    **fill(tool.get("parameters", {}), "", urgent, "weighing"),
                }
            )
            continue
        if tool.get("paths") or tool.get("kind") == "latent" or tool["name"] in readers:
            continue
        args = fill(tool.get("parameters", {}), "", urgent, "decided from the state")
        calls.append(
            {
                "_tool": tool["name"],
                "_instance": token,
                "_reasoningForCall": "everything needed is in the state",
                "_scopes": ["input", "†state"],
                **(args if isinstance(args, dict) else {}),
            }
        )
    return calls


def _tool_of(tools: list[dict[str, Any]], name: str) -> dict[str, Any]:
    return next((t for t in tools if t["name"] == name), {})


def _branch_readers(tools: list[dict[str, Any]], awaited: list[dict[str, Any]]) -> dict[str, str]:
    """Fire-and-forget activities whose description says they read one alternative of
    a branching tool's paths (as the tickets' pageOnCall reads †state.urgent): the tool's
    name to that path. A model reads descriptions; so does the simulator."""
    branches = [p for t in awaited if len(t["paths"]) > 1 for p in t["paths"]]
    out = {}
    for tool in tools:
        if tool.get("paths") or tool.get("kind") == "latent":
            continue
        said = str(tool.get("description", ""))
        path = next((p for p in branches if f"Reads {p}" in said), None)
        if path is not None:
            out[tool["name"]] = path
    return out


def lazy_steps(
    token: str, view: dict[str, Any], tools: list[dict[str, Any]], text: str
) -> list[dict[str, Any]]:
    """A lazy plan's turn: the graph (first turn), or the due latent steps (later)."""
    plan = view.get("plan")
    if plan:
        calls = []
        for step in plan:
            if step.get("status") != "due":
                continue
            tool = next((t for t in tools if t["name"] == step["tool"]), None)
            args = (
                fill(tool.get("parameters", {}), "", False, f"notes: {text[:60]}") if tool else {}
            )
            calls.append(
                {
                    "_tool": step["tool"],
                    "_instance": token,
                    "_reasoningForCall": "the approved plan's due step",
                    **({"_outputPath": step["_outputPath"]} if step.get("_outputPath") else {}),
                    **(args if isinstance(args, dict) else {}),
                }
            )
        return calls
    calls = []
    written: list[str] = []
    for tool in tools:
        paths = tool.get("paths") or []
        if tool.get("kind") == "latent" and not paths:
            continue  # a thought has no place in a graph: nothing reads it
        fetch = bool(paths) and tool.get("kind") != "latent"
        call: dict[str, Any] = {
            "_tool": tool["name"],
            "_instance": token,
            "_reasoningForCall": "planned",
            # Lookups read the input only (they run at once, side by side); the rest read
            # what the steps before them write, so they wait for those.
            "_scopes": ["input"] if fetch else ["input", *written],
        }
        if paths:
            call["_outputPath"] = paths[0] if tool.get("kind") == "latent" else " || ".join(paths)
        if tool.get("kind") != "latent":
            args = fill(tool.get("parameters", {}), "", False, "planned from the input")
            call.update(args if isinstance(args, dict) else {})
        calls.append(call)
        written += [p.strip() for p in paths]
    return calls
