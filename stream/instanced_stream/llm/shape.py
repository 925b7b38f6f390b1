"""The request's shape: which parameters a request carries and how it asks for JSON.

Endpoints disagree on the parameters they take: OpenAI's reasoning models (the GPT-5
family, the o-series) refuse `max_tokens` (they take `max_completion_tokens`, which also
bounds their hidden reasoning) and any temperature but the default, some servers have no
strict structured output. One shape is chosen at start, by probing the endpoint with a
real request (`instanced_stream.llm.preflight`) or from the spec's `model.request`, and every
request is built from it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal

import orjson

__all__ = ["FORMATS", "Format", "RequestShape", "TokensParam"]

TokensParam = Literal["max_tokens", "max_completion_tokens"]
# From the most to the least the endpoint enforces: each is the fallback of the one before.
Format = Literal["json_schema_strict", "json_schema", "json_object", "text"]
FORMATS: tuple[Format, ...] = ("json_schema_strict", "json_schema", "json_object", "text")

_TEXT_INSTRUCTION = (
    "Answer with one JSON object and nothing else (no prose, no code fence), valid against "
    "this JSON Schema: "
)


def _names(param: str | None, message: str, name: str) -> bool:
    return (param or "").startswith(name) or f"'{name}'" in message or f"`{name}`" in message


@dataclass(frozen=True, slots=True)
class RequestShape:
    tokens_param: TokensParam = "max_tokens"
    temperature: bool = True  # send the spec's temperature; False: the endpoint's default
    response_format: Format = "json_schema_strict"
    reasoning_effort: bool = True  # send model.reasoning_effort when the spec sets one

    def label(self) -> str:
        """How logs and `stream check --endpoint` name the shape."""
        temperature = "temperature" if self.temperature else "no temperature"
        return f"{self.tokens_param}, {temperature}, response_format {self.response_format}"

    def labels(self) -> dict[str, str]:
        """The shape as metric labels."""
        return {
            "tokens_param": self.tokens_param,
            "temperature": "sent" if self.temperature else "omitted",
            "response_format": self.response_format,
        }

    def body(
        self,
        model: str,
        messages: list[dict[str, str]],
        response_format: dict[str, Any],
        *,
        temperature: float,
        cap: int | None,
        reasoning_effort: str | None = None,
    ) -> dict[str, Any]:
        """The request body. `response_format` is what the prompt asks for at best (a
        strict json_schema, or json_object where the spec says so); the shape may ask for
        less, down to the schema written into the prompt."""
        body: dict[str, Any] = {"model": model, "messages": messages}
        if self.temperature:
            body["temperature"] = temperature
        if cap is not None:
            body[self.tokens_param] = cap
        if reasoning_effort is not None and self.reasoning_effort:
            body["reasoning_effort"] = reasoning_effort
        schema = response_format.get("json_schema") if response_format else None
        if self.response_format == "json_schema_strict" or schema is None:
            fmt = response_format if self.response_format != "text" else None
        elif self.response_format == "json_schema":
            fmt = {"type": "json_schema", "json_schema": {**schema, "strict": False}}
        elif self.response_format == "json_object":
            fmt = {"type": "json_object"}
        else:
            fmt = None
        if fmt:
            body["response_format"] = fmt
        elif self.response_format == "text":
            # The schema goes last, after the cached prefix: it names the batch's tokens.
            wanted = orjson.dumps(schema["schema"]).decode() if schema else "{}"
            body["messages"] = [*messages, {"role": "user", "content": _TEXT_INSTRUCTION + wanted}]
        return body

    def instead(self, param: str | None, code: str | None, message: str) -> RequestShape | None:
        """The next shape to try after the endpoint refused this one for a parameter
        (`param`, `code` and `message` as the endpoint said them); None: nothing known."""
        # Refused as such, not for its value ("max_tokens is too large" is the spec's to fix).
        said = message.lower()
        unsupported = code in ("unsupported_parameter", "unsupported_value", "unknown_parameter")
        unsupported = unsupported or any(
            w in said for w in ("unsupported", "not support", "unrecognized", "unknown")
        )
        renamed = unsupported or "max_completion_tokens" in message
        if self.tokens_param == "max_tokens" and _names(param, message, "max_tokens") and renamed:
            return replace(self, tokens_param="max_completion_tokens")
        if self.temperature and _names(param, message, "temperature") and unsupported:
            return replace(self, temperature=False)
        if self.reasoning_effort and _names(param, message, "reasoning_effort") and unsupported:
            return replace(self, reasoning_effort=False)
        schema_refused = code in ("invalid_schema", "invalid_json_schema") or _names(
            param, message, "response_format"
        )
        if schema_refused or "json_schema" in message or "strict" in (param or ""):
            at = FORMATS.index(self.response_format)
            if at + 1 < len(FORMATS):
                return replace(self, response_format=FORMATS[at + 1])
        return None
