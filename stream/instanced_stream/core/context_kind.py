"""Context kinds: a record that declares itself a tool, an advisor, a plan or a global
input, wherever it was sent.

The seeds write one request as a list of messages of kinds `input`, `state`, `tool`,
`advisor` and `plan`, an input without `_instance` being global. The product takes
context (everything but an instance's own input and state) from the spec and the
compacted context topic; a producer who sends one to the input topic instead is told so
(runtime/pipeline/intake.py), never has it read as one instance's data.
"""

from __future__ import annotations

from typing import Any

__all__ = ["CONTEXT_KINDS", "context_key", "declared_kind"]

CONTEXT_KINDS = ("tool", "advisor", "plan", "input")


def declared_kind(payload: dict[str, Any], key: bytes | None) -> str | None:
    """The context kind `payload` declares (`type`, else `kind`, as the seeds write both),
    or None for an item. A `tool`, `advisor` or `plan` is context wherever it names itself
    so. An `input` is global only when nothing makes it an instance's: neither `_instance`
    nor a record key (a keyed input is that key's instance, as every item is)."""
    declared = [payload.get("type"), payload.get("kind")]
    kind = next((k for k in declared if k in CONTEXT_KINDS), None)
    if kind == "input" and (payload.get("_instance") is not None or key is not None):
        return None
    return kind if isinstance(kind, str) else None


def context_key(kind: str, payload: dict[str, Any], origin: str) -> str:
    """The key a context message of `kind` is kept under on the compacted context topic,
    where the latest per key wins and a tombstone removes it: an advisor by its id, a tool
    by its name, the plan by `plan` (there is one); a global input by its `name` when it
    has one, else by where it came from (`origin`), so that it replaces nothing."""
    if kind == "advisor" and isinstance(payload.get("id"), str):
        return str(payload["id"])
    if kind == "tool" and isinstance(payload.get("name"), str):
        return str(payload["name"])
    if kind == "plan":
        return "plan"
    if kind == "input" and isinstance(payload.get("name"), str):
        return str(payload["name"])
    return f"{kind}@{origin}"
