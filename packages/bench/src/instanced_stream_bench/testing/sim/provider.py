"""The request rules and error shapes of a provider, as its documentation states them,
for the simulator to enforce (`stream llm-sim --provider openai`).

`generic` is what most OpenAI-compatible servers do (llama.cpp, vLLM, Ollama): any
parameter is taken. `openai` is OpenAI's API: its error JSON (`{"error": {"message",
"type", "param", "code"}}`), its reasoning models (GPT-5 family, o-series) refusing
`max_tokens` (they take `max_completion_tokens`) and any temperature but 1, other models
refusing `reasoning_effort`, strict schemas held to the documented subset, and its
rate-limit headers (`x-ratelimit-*`, `retry-after-ms` on a 429). `azure` is Azure
OpenAI: the same rules behind `/openai/deployments/<deployment>/chat/completions?
api-version=...` with the key in an `api-key` header.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from instanced_stream.llm.strict import violations

from instanced_stream_bench.testing.sim.account import SimConfig

__all__ = [
    "PROVIDERS",
    "ProviderName",
    "Refusal",
    "account_fault",
    "reasoning_model",
    "refusal",
    "serves",
]

ProviderName = Literal["generic", "openai", "azure"]
PROVIDERS: tuple[ProviderName, ...] = ("generic", "openai", "azure")

# OpenAI's public model families (the simulator answers for any of them by name).
_OPENAI_MODELS = re.compile(r"^(gpt-|o\d|chatgpt-)")
_REASONING = re.compile(r"^(gpt-5|o\d)")


@dataclass(frozen=True, slots=True)
class Refusal:
    status: int
    message: str
    type: str = "invalid_request_error"
    param: str | None = None
    code: str | None = None

    def body(self, provider: ProviderName = "openai") -> dict[str, Any]:
        if provider == "generic":  # most servers say less
            return {"error": {"message": self.message, "type": self.type}}
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


def serves(provider: ProviderName, model: str, own: str) -> bool:
    """Whether the endpoint knows `model` (`own`: the simulator's own name)."""
    return model == own or (provider != "generic" and bool(_OPENAI_MODELS.match(model)))


def account_fault(
    config: SimConfig,
    headers: Mapping[str, str],
    query: Mapping[str, str],
    body: dict[str, Any],
    own: str,
) -> str | None:
    """What an account refuses before it reads the request: a key it does not know (401),
    a model it does not serve or, at Azure, a request without api-version (404)."""
    if config.provider == "azure":
        given = headers.get("api-key")
        if "api-version" not in query:
            return "404"
    else:
        given = (headers.get("Authorization") or "").removeprefix("Bearer ")
    if config.api_key is not None and given != config.api_key:
        return "401"
    if not serves(config.provider, str(body.get("model")), own):
        return "404"
    return None


def reasoning_model(model: str) -> bool:
    return bool(_REASONING.match(model))


def refusal(provider: ProviderName, body: dict[str, Any]) -> Refusal | None:
    """What the provider refuses in this request body, as it says it; None: accepted."""
    if provider == "generic":
        return None
    model = str(body.get("model", ""))
    if reasoning_model(model):
        if "max_tokens" in body:
            return Refusal(
                400,
                "Unsupported parameter: 'max_tokens' is not supported with this model. "
                "Use 'max_completion_tokens' instead.",
                param="max_tokens",
                code="unsupported_parameter",
            )
        temperature = body.get("temperature")
        if temperature is not None and temperature != 1:
            return Refusal(
                400,
                f"Unsupported value: 'temperature' does not support {temperature:g} with this "
                "model. Only the default (1) value is supported.",
                param="temperature",
                code="unsupported_value",
            )
    elif "reasoning_effort" in body:
        return Refusal(
            400,
            "Unrecognized request argument supplied: reasoning_effort",
            param="reasoning_effort",
            code="unsupported_parameter",
        )
    fmt = body.get("response_format") or {}
    if fmt.get("type") == "json_schema" and fmt.get("json_schema", {}).get("strict"):
        schema = fmt["json_schema"].get("schema", {})
        problems = violations(schema)
        if problems:
            name = fmt["json_schema"].get("name", "")
            return Refusal(
                400,
                f"Invalid schema for response_format '{name}': {problems[0]}",
                param="response_format",
                code="invalid_schema",
            )
    if fmt.get("type") == "json_object":
        said = " ".join(str(m.get("content", "")) for m in body.get("messages", []))
        if "json" not in said.lower():
            return Refusal(
                400,
                "'messages' must contain the word 'json' in some form, to use "
                "'response_format' of type 'json_object'.",
                param="messages",
            )
    return None
