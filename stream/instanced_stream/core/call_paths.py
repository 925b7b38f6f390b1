"""Where a call may write and read: its `_outputPath` and `_scopes`, checked against the
tool's declaration (a refused one never reaches an activity topic)."""

from __future__ import annotations

from typing import Any

from instanced_stream.core.call_meta import STATE, fire_and_forget
from instanced_stream.core.spec import Tool

__all__ = ["output_path_problem", "path_ok", "scopes_problem"]


def path_ok(path: str, root: str) -> bool:
    """`root` itself or `root.a.b` with non-empty keys."""
    if path == root:
        return True
    keys = path.removeprefix(root + ".").split(".") if path.startswith(root + ".") else []
    return bool(keys) and all(k.strip() == k and k for k in keys)


def output_path_problem(tool: Tool, output_path: str) -> str | None:
    """Why a call's `_outputPath` cannot be honoured, or None. Each alternative must be a
    †state path among the tool's declared paths (any †state.key path when it declares
    none: †state itself only when declared, since a result merged into the whole state
    must be an object, and only a declared path is that promise). A latent call may
    name alternatives too: the model writes its output in the answer, so its branch
    collapses to one path as it writes it (core/plan_graph.py `collapse`). An activity that declares
    neither paths nor `_output` is fire-and-forget (the spec's own definition): it keeps
    nothing."""
    if fire_and_forget(tool):
        return (
            f"_outputPath {output_path!r}: {tool.name} declares neither paths nor _output, "
            "so it is fire-and-forget and nothing of it is kept: leave _outputPath null"
        )
    paths = [p.strip() for p in output_path.split("||")]
    if not all(paths) or not all(path_ok(p, STATE) for p in paths):
        return f"_outputPath {output_path!r}: each alternative must be {STATE} or {STATE}.key"
    if tool.paths and not set(paths) <= set(tool.paths):
        return f"_outputPath {output_path!r}: {tool.name} writes only to {tool.paths}"
    if STATE in paths and STATE not in tool.paths and tool.kind == "activity":
        return (
            f"_outputPath {output_path!r}: {tool.name} declares no {STATE} path, so its "
            f"result may not replace the whole state; write it to {STATE}.<key>"
        )
    return None


def scopes_problem(scopes: Any) -> str | None:
    """Why a call's `_scopes` do not resolve, or None: each is input, input.<field>,
    †state or †state.<path>."""
    if not isinstance(scopes, list) or not all(isinstance(x, str) for x in scopes):
        return "_scopes must be a list of strings"
    unknown = [x for x in scopes if not (path_ok(x, "input") or path_ok(x, STATE))]
    if unknown:
        return f"_scopes {unknown}: a scope is input, input.<field>, {STATE} or {STATE}.<path>"
    return None
