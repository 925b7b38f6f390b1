"""Overrides: global messages (advisors, global inputs, tools and the plan) that ops change
without redeploying the spec, merged into it.

They arrive on the compacted context topic (instanced_stream.runtime.pipeline.overrides follows
it). Each message is keyed by what it names (an advisor id, or an input's name); the latest per key
wins and a tombstone removes it. An advisor message overrides the spec's advisor of the
same id, a tool message the spec's tool of the same name (or adds a latent one: a new
activity needs its topic), a plan message the spec's plan (a spec without one runs no
workflow to take it). A message that does not validate is refused, with a reason naming
the message and the field, and the rest still apply: one bad record must not stop a
running processor.
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


def _normalised(kind: str, message: dict[str, Any]) -> dict[str, Any]:
    """The message as the spec's model reads it: the seeds name the kind `type` or
    `kind`, but a tool's `kind` is activity or latent, and a plan has no `kind`."""
    if kind in ("tool", "plan", "input") and message.get("kind") == kind:
        return {**{k: v for k, v in message.items() if k != "kind"}, "type": kind}
    return message


def apply_overrides(spec: AgentSpec, messages: Messages) -> tuple[AgentSpec, Refused]:
    """The spec with the messages merged in, and the refused ones with reasons."""
    base = spec.model_dump(by_alias=True)
    advisors: dict[str, Any] = {a["id"]: a for a in base["advisors"]}
    tools: dict[str, Any] = {t["name"]: t for t in base["tools"]}
    declared = {t.name for t in spec.tools if t.kind == "activity"}
    plan: Any = base["plan"]
    inputs: dict[str, Any] = {}
    refused: Refused = []

    def merged(
        advisors: dict[str, Any], tools: dict[str, Any], plan: Any, inputs: dict[str, Any]
    ) -> dict[str, Any]:
        return {
            **base,
            "advisors": list(advisors.values()),
            "tools": list(tools.values()),
            "plan": plan,
            "inputs": [*base["inputs"], *inputs.values()],
        }

    for key, value in sorted(messages.items()):
        if value is None:
            continue  # a tombstone: the message was removed
        try:
            message = orjson.loads(value)
        except orjson.JSONDecodeError as exc:
            refused.append((key, f"context message {key!r} is not JSON: {exc}"))
            continue
        # The seeds write an advisor's kind as `type` in one text and `kind` in another.
        kinds = [message.get("type"), message.get("kind")] if isinstance(message, dict) else []
        kind = next((k for k in kinds if k in _KINDS), None)
        if kind is None:
            refused.append((key, f"context message {key!r}: type must be one of {_KINDS}"))
            continue
        message = _normalised(kind, message)
        trial_advisors, trial_tools, trial_plan = dict(advisors), dict(tools), plan
        trial_inputs = dict(inputs)
        if kind == "advisor":
            trial_advisors[str(message.get("id", key))] = message
        elif kind == "tool":
            name = str(message.get("name", key))
            if message.get("kind", "activity") == "activity" and name not in declared:
                # An activity's topic and its workers are made with the deployment.
                refused.append(
                    (
                        key,
                        f"context message {key!r}: activity tool {name!r} is not in the "
                        "spec; a new activity needs its topic and workers: add it to the spec",
                    )
                )
                continue
            trial_tools[name] = message
        elif kind == "plan":
            if spec.plan is None:
                # A plan-less processor has no state store or workflow to run one on.
                refused.append(
                    (
                        key,
                        f"context message {key!r}: a plan replaces the spec's plan, and "
                        "this spec has none (stateless): add `plan:` to the spec and restart",
                    )
                )
                continue
            trial_plan = message
        else:
            trial_inputs[key] = message
        try:
            AgentSpec.model_validate(merged(trial_advisors, trial_tools, trial_plan, trial_inputs))
        except ValidationError as exc:
            refused.append((key, f"context message {key!r} refused: {_problem(exc)}"))
            continue
        advisors, tools, plan, inputs = trial_advisors, trial_tools, trial_plan, trial_inputs
    return AgentSpec.model_validate(merged(advisors, tools, plan, inputs)), refused


_KINDS = ("advisor", "input", "plan", "tool")
