"""The simulator's plans: what it calls for a stateful instance, turn by turn, in the
order a request chose (`arrange`): a model may list a step's readers before it.

Eager (`plan_step`): the latent steps the plan shows as due are answered first; then
fetch what the state still lacks and write latent notes in the same answer, with the
steps that read one branch of a fetch (they wait for it); in the `interleaved` order a
latent note also reads a fetch's result (a latent intermediary: it is due again once the
result is in). Once everything is known, act, after two private thoughts. Lazy
(`lazy_steps`): on the planning turn the whole graph, latent steps without arguments,
each step reading (`_scopes`) what other steps write; on a follow-up turn, the steps the
plan shows as due, answered.
"""

from __future__ import annotations

from typing import Any

from instanced_stream.core.state import read_path

__all__ = ["ORDERS", "THOUGHT", "arrange", "fill", "lazy_steps", "plan_step"]

# The orders a plan's calls may come in: producers first (as a careful model writes),
# readers first (the reverse), or interleaved (from both ends, with a latent intermediary).
ORDERS = ("producers_first", "readers_first", "interleaved")

# How the simulator's thoughts begin: a test looks for it on every topic (never found).
THOUGHT = "private thought"


def arrange(calls: list[dict[str, Any]], order: str) -> list[dict[str, Any]]:
    """`calls` (written producers first) in `order`."""
    if order == "readers_first":
        return calls[::-1]
    if order == "interleaved":
        ends = [x for pair in zip(calls[::-1], calls, strict=True) for x in pair]
        return list({id(c): c for c in ends}.values())  # each call once, first place kept
    return list(calls)


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
    token: str,
    view: dict[str, Any],
    tools: list[dict[str, Any]],
    text: str,
    order: str = "producers_first",
) -> list[dict[str, Any]]:
    """A stateful turn: the due latent steps; then fetch what the state still lacks
    (awaited calls and latent notes), or, once everything is known, act with the final
    tools and await nothing. In `order`."""
    due = _due_answers(token, view, tools, text)
    return due + arrange(_eager_calls(token, view, tools, text, order), order)


def _due_answers(
    token: str, view: dict[str, Any], tools: list[dict[str, Any]], text: str
) -> list[dict[str, Any]]:
    """The latent steps the plan shows as due, answered."""
    calls = []
    for step in view.get("plan") or []:
        if step.get("status") != "due":
            continue
        tool = next((t for t in tools if t["name"] == step["tool"]), None)
        args = fill(tool.get("parameters", {}), "", False, f"notes: {text[:60]}") if tool else {}
        calls.append(
            {
                "_tool": step["tool"],
                "_instance": token,
                "_reasoningForCall": "the plan's due step",
                **({"_outputPath": step["_outputPath"]} if step.get("_outputPath") else {}),
                **(args if isinstance(args, dict) else {}),
            }
        )
    return calls


def _eager_calls(
    token: str, view: dict[str, Any], tools: list[dict[str, Any]], text: str, order: str
) -> list[dict[str, Any]]:
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
            note = f"notes: {text[:60]}" if tool.get("paths") else f"{THOUGHT}: what is it?"
            args = fill(tool.get("parameters", {}), "", False, note)
            call = {
                "_tool": tool["name"],
                "_instance": token,
                "_reasoningForCall": "thinking it through",
                **(args if isinstance(args, dict) else {}),
            }
            if tool.get("paths"):
                call["_outputPath"] = tool["paths"][0]
                if order == "interleaved":
                    # A latent intermediary: the note reads what a fetch awaits, so it
                    # waits for it (and is answered again then).
                    call["_scopes"] = [missing[0]["paths"][0]]
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
            # Two thoughts before acting (multi-step reasoning in one turn): never
            # stored, never published.
            for n in (1, 2):
                calls.append(
                    {
                        "_tool": tool["name"],
                        "_instance": token,
                        "_reasoningForCall": "weighing the state",
                        **fill(tool.get("parameters", {}), "", urgent, f"{THOUGHT} {n}"),
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
    token: str,
    view: dict[str, Any],
    tools: list[dict[str, Any]],
    text: str,
    order: str = "producers_first",
) -> list[dict[str, Any]]:
    """A lazy plan's turn: the graph (first turn, in `order`), or the due latent steps."""
    if view.get("plan"):
        return _due_answers(token, view, tools, text)
    calls = []
    written: list[str] = []
    readers = _branch_readers(
        tools, [t for t in tools if t.get("paths") and t.get("kind") != "latent"]
    )
    for tool in tools:
        paths = tool.get("paths") or []
        if tool.get("kind") == "latent" and not paths:
            continue  # a thought has no place in a graph: nothing reads it
        fetch = bool(paths) and tool.get("kind") != "latent"
        call: dict[str, Any] = {
            "_tool": tool["name"],
            "_instance": token,
            "_reasoningForCall": "planned",
            # Lookups read the input only (they run at once, side by side); a step of one
            # branch reads that branch (it is skipped on the other); the rest read what
            # the steps before them write, so they wait for those.
            "_scopes": ["input"]
            if fetch
            else ["input", readers[tool["name"]]]
            if tool["name"] in readers
            else ["input", *written],
        }
        if paths:
            call["_outputPath"] = paths[0] if tool.get("kind") == "latent" else " || ".join(paths)
        if tool.get("kind") != "latent":
            args = fill(tool.get("parameters", {}), "", False, "planned from the input")
            call.update(args if isinstance(args, dict) else {})
        calls.append(call)
        written += [p.strip() for p in paths]
    return arrange(calls, order)
