"""A model endpoint in memory, behind the real openai client (httpx2's MockTransport):
the unit tests drive `instanced_stream.llm.LLM` through HTTP status codes and provider error
JSON without a socket. It answers with the simulator's judge and follows a provider's request
rules (`instanced_stream_bench.testing.sim.provider`); `fail` decides a response of its own per
request."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx2
import orjson
from instanced_stream.llm.client import LLM
from instanced_stream.llm.options import Collaborators, Listener, Recovery, RequestOptions
from instanced_stream.retry import RetryPolicy
from instanced_stream_bench.testing.sim.provider import ProviderName, Refusal, refusal
from instanced_stream_bench.testing.sim.request import read_request
from instanced_stream_bench.testing.sim.server import Simulator

__all__ = ["MemoryEndpoint"]

Fail = Callable[[dict[str, Any]], Refusal | None]


class MemoryEndpoint:
    def __init__(self, provider: ProviderName = "generic", model: str = "stream-sim-1") -> None:
        self.provider = provider
        self.model = model
        self.sim = Simulator()
        self.bodies: list[dict[str, Any]] = []
        self.fail: Fail | None = None
        self.headers: dict[str, str] = {}

    def handle(self, request: httpx2.Request) -> httpx2.Response:
        body = orjson.loads(request.content)
        self.bodies.append(body)
        refused = refusal(self.provider, body) or (self.fail(body) if self.fail else None)
        if refused is not None:
            return httpx2.Response(
                refused.status, json=refused.body(self.provider), headers=self.headers
            )
        text = self.sim.answer(read_request(body["messages"]))
        return httpx2.Response(
            200,
            json={
                "id": "mem-1",
                "object": "chat.completion",
                "created": 0,
                "model": body["model"],
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": "stop",
                        "message": {"role": "assistant", "content": text},
                    }
                ],
                "usage": {
                    "prompt_tokens": 100,
                    "completion_tokens": 70,
                    "total_tokens": 170,
                    "completion_tokens_details": {"reasoning_tokens": 30},
                },
            },
        )

    def llm(
        self,
        request: RequestOptions | None = None,
        *,
        adapt: bool = False,
        listener: Listener | None = None,
    ) -> LLM:
        """A client of this endpoint that retries within milliseconds."""
        transport = httpx2.MockTransport(self.handle)
        return LLM(
            base_url="http://memory/v1",
            api_key="none",
            model=self.model,
            timeout_s=5,
            request=request,
            recovery=Recovery(retry=RetryPolicy(base_s=0.001, cap_s=0.005), adapt=adapt),
            collaborators=Collaborators(
                listener=listener, http_client=httpx2.AsyncClient(transport=transport)
            ),
        )
