"""The keyed answer: calls grouped by instance, every instance's key required.

The protocol's answer is an array of calls, each naming its instance, so nothing in its
schema stops a model from skipping an instance or naming one twice; the re-asks that
follow cost requests. Keyed by instance number,

    {"calls": {"1": [{"_tool": "moderateComment", "decision": "reject"}], "2": [...]}}

with every key required, each holding at least one call, and no other key allowed
(`additionalProperties: false`), a skipped or invented instance is impossible wherever
the schema is enforced (grammar-constrained decoding, strict structured outputs). The
keys are positional like the batch's tokens, so every window of n items has the same
schema; the calls' branches are written once, under `$defs`, and referred to per key.
`expand` reads the answer back into protocol calls, checked one by one as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from instanced_stream.core.compact import Unreadable, token_of
from instanced_stream.core.instructions import DATA_RULE, OVERRIDE_RULE

__all__ = ["CALL_REF", "MARK", "PROTOCOL", "calls_schema", "expand"]

CALL_REF = "#/$defs/call"
# How the simulator (and a reader of the prompt) tells the keyed answer apart.
MARK = "keyed by instance number"

PROTOCOL = f"""\
# Protocol
The user message is a JSON array of input messages ("type" is "input" where it is
missing). A message with "_instance" belongs to one independent instance, numbered 1, 2,
... {OVERRIDE_RULE} Answer with a JSON object {{"calls": {{"1": [...], "2": [...], ...}}}}:
the calls {MARK}, one key for every instance and no other. Each call has "_tool" (a tool
name), {{reasoning}}and the tool's arguments. Give every instance at least one call; when
an instance needs nothing, call NoAction for it. Never name a tool that is not listed.
{DATA_RULE} Write compact JSON: no line breaks, no indentation."""


def calls_schema(
    n: int, branches: list[dict[str, Any]], most: int, bounded: bool = True
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The `calls` object of a window of n, and the `$defs` its keys refer to. The
    branches are the protocol's call branches; the key names the instance, so their
    `_instance` is dropped."""
    calls = []
    for branch in branches:
        props = {k: v for k, v in branch["properties"].items() if k != "_instance"}
        required = [k for k in branch["required"] if k != "_instance"]
        calls.append({**branch, "properties": props, "required": required})
    per_key: dict[str, Any] = {"type": "array", "items": {"$ref": CALL_REF}, "minItems": 1}
    if bounded:  # a weak model may repeat calls until its context is full
        per_key["maxItems"] = most
    keys = [str(k) for k in range(1, n + 1)]
    schema = {
        "type": "object",
        "additionalProperties": False,
        "required": keys,
        "properties": dict.fromkeys(keys, per_key),
    }
    return schema, {"call": {"anyOf": calls}}


def expand(calls: dict[str, Any], tokens: Sequence[str]) -> list[dict[str, Any] | Unreadable]:
    """Protocol calls from a keyed `calls` object, in answer order; a key that names no
    instance of the batch becomes calls the validator refuses as unknown_instance."""
    out: list[dict[str, Any] | Unreadable] = []
    for key, group in calls.items():
        number: Any = int(key) if key.isdigit() else key
        token = token_of(number, tokens)
        known = token if isinstance(token, str) and token in tokens else None
        for raw in group if isinstance(group, list) else [group]:
            if not isinstance(raw, dict):
                out.append(Unreadable(f"instance {key}: a call must be an object", raw, known))
                continue
            out.append({**raw, "_instance": token if known else f"#{key}"})
    return out
