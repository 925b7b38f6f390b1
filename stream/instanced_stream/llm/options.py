"""What the model client is built with besides its endpoint (URL, key, model, timeout):
three frozen values, each of settings that travel together from the spec and the
settings to `LLM`, and on to the batch tier's lines, which are built like its requests.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from instanced_stream.llm.limiter import Limiter
from instanced_stream.llm.pacer import Pacer
from instanced_stream.llm.shape import RequestShape
from instanced_stream.retry import RetryPolicy

__all__ = ["Collaborators", "Listener", "Recovery", "RequestOptions"]


class Listener(Protocol):
    """Told of every answer, retry and circuit change (the processor's metrics)."""

    def observe_latency(self, seconds: float) -> None: ...
    def on_retry(self) -> None: ...
    def on_circuit(self, is_open: bool) -> None: ...
    def on_refused(self, status: int | None) -> None: ...
    def on_shape(self, labels: dict[str, str]) -> None: ...


@dataclass(frozen=True, slots=True)
class RequestOptions:
    """What every request looks like: the parameters the endpoint accepts (`shape`), the
    spec's values for them, and how the endpoint is addressed and named in traces."""

    shape: RequestShape = field(default_factory=RequestShape)
    temperature: float = 0.0
    max_output_tokens: int | None = None  # the spec's cap; a request may ask for less
    reasoning_effort: str | None = None
    # max_completion_tokens bounds hidden reasoning too: room for it on top of the
    # answer's own cap, or a reasoning model would stop before it wrote anything.
    reasoning_headroom: int = 0
    # Azure OpenAI's api-version: set, the deployment goes in the path (its own client).
    api_version: str | None = None
    provider: str | None = None  # traces' gen_ai.provider.name; None: from the URL

    def cap(self, max_tokens: int | None) -> int | None:
        """The output cap a request is sent with: the lower of the spec's and the
        caller's `max_tokens`, plus the reasoning headroom where the cap bounds reasoning;
        None: no cap."""
        caps = [c for c in (self.max_output_tokens, max_tokens) if c is not None]
        cap = min(caps) if caps else None
        if cap is not None and self.shape.tokens_param == "max_completion_tokens":
            cap += self.reasoning_headroom
        return cap

    def body(
        self,
        model: str,
        messages: list[dict[str, str]],
        response_format: dict[str, Any],
        cap: int | None,
    ) -> dict[str, Any]:
        """The request's body in this shape, with `cap` (from `cap`)."""
        return self.shape.body(
            model,
            messages,
            response_format,
            temperature=self.temperature,
            cap=cap,
            reasoning_effort=self.reasoning_effort,
        )


@dataclass(frozen=True, slots=True)
class Recovery:
    """How a request survives failure: the back-off between tries, how many 5xx in a row
    hand a request back to be split, and whether a refused parameter is switched."""

    retry: RetryPolicy = field(default_factory=RetryPolicy)
    server_attempts: int = 3
    # The shape was not proven at start (the endpoint did not answer the probe) and the
    # spec does not force one: a refused parameter is switched as the probe would.
    adapt: bool = False


@dataclass(frozen=True, slots=True)
class Collaborators:
    """The objects the client shares with the rest of the processor, each optional."""

    listener: Listener | None = None  # the metrics
    limiter: Limiter | None = None  # told of every answer and every refusal
    pacer: Pacer | None = None  # the provider's per-minute budget, learnt from its headers
    # An httpx client of one's own (tests: a transport in memory); None: the SDK's.
    http_client: Any = None
