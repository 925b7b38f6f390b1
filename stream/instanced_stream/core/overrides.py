"""Overrides: global messages (advisors and global inputs) that ops change without
redeploying the spec, merged into it.

They arrive on the compacted context topic (instanced_stream.runtime.pipeline.overrides follows
it). Each message is keyed by what it names (an advisor id, or an input's name); the latest per key
wins and a tombstone removes it. An advisor message overrides the spec's advisor of the
same id. A message that does not validate is refused, with a reason naming the message and
the field, and the rest still apply: one bad record must not stop a running processor.
"""

from __future__ import annotations

from typing import Any

import orjson
from pydantic import ValidationError

from instanced_stream.core.spec import AgentSpec

__all__ = ["Messages", "Refused", "apply_overrides"]

Messages = dict[str, bytes | None]  # key -> latest value (None: a tombstone)
Refused = list[tuple[str, str]]  # (key, why)


def _problem(exc: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(p) for p in e['loc']) or '(top)'}: {e['msg']}" for e in exc.errors()
    )


def apply_overrides(spec: AgentSpec, messages: Messages) -> tuple[AgentSpec, Refused]:
    """The spec with the messages merged in, and the refused ones with reasons."""
    base = spec.model_dump(by_alias=True)
    advisors: dict[str, Any] = {a["id"]: a for a in base["advisors"]}
    inputs: dict[str, Any] = {}
    refused: Refused = []
    for key, value in sorted(messages.items()):
        if value is None:
            continue  # a tombstone: the message was removed
        try:
            message = orjson.loads(value)
        except orjson.JSONDecodeError as exc:
            refused.append((key, f"context message {key!r} is not JSON: {exc}"))
            continue
        # The seeds write an advisor's kind as `type` in one text and `kind` in another.
        kind = (message.get("type") or message.get("kind")) if isinstance(message, dict) else None
        if kind not in ("advisor", "input"):
            refused.append((key, f"context message {key!r}: type must be advisor or input"))
            continue
        trial_advisors, trial_inputs = dict(advisors), dict(inputs)
        if kind == "advisor":
            trial_advisors[str(message.get("id", key))] = message
        else:
            trial_inputs[key] = message
        try:
            AgentSpec.model_validate(
                {
                    **base,
                    "advisors": list(trial_advisors.values()),
                    "inputs": [*base["inputs"], *trial_inputs.values()],
                }
            )
        except ValidationError as exc:
            refused.append((key, f"context message {key!r} refused: {_problem(exc)}"))
            continue
        advisors, inputs = trial_advisors, trial_inputs
    merged = AgentSpec.model_validate(
        {**base, "advisors": list(advisors.values()), "inputs": [*base["inputs"], *inputs.values()]}
    )
    return merged, refused
