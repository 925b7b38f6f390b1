"""In-memory fakes: the simulator's decisions without HTTP, for unit tests."""

from __future__ import annotations

from typing import Any

from instanced_stream.core.instance import Instance
from instanced_stream.core.messages import SourcePosition
from instanced_stream.errors import LLMError
from instanced_stream.llm.client import Completion
from instanced_stream.testing.judge import read_request
from instanced_stream.testing.simulator import SimRequest, Simulator


def make_batch(texts: list[str], prefix: str = "id-") -> list[Instance]:
    """Instances with ids prefix0.. at offsets 0.. of partition 0 of topic "items"."""
    return [
        Instance(
            id=f"{prefix}{i}",
            payload={"comment": t},
            source=SourcePosition(topic="items", partition=0, offset=i),
            size=len(t),
        )
        for i, t in enumerate(texts)
    ]


class FakeLLM:
    """Answers like the simulator does, in process; can fail requests on demand."""

    model = "fake"

    def __init__(self, sim: Simulator | None = None) -> None:
        self.sim = sim or Simulator()
        self.requests: list[list[dict[str, Any]]] = []
        self.asks: list[SimRequest] = []
        self.reject_marker: str | None = None
        self.messages: list[list[dict[str, str]]] = []
        # Requests of more instances than this time out; so does any holding the marker.
        self.timeout_over: int | None = None
        self.timeout_marker: str | None = None

    async def complete(
        self,
        messages: list[dict[str, str]],
        response_format: dict[str, Any],
        *,
        items: int = 1,
        max_tokens: int | None = None,
        since: float | None = None,
        keys: tuple[str, ...] = (),
    ) -> Completion:
        req = read_request(messages)
        self.requests.append(req.items)
        self.asks.append(req)
        self.messages.append(messages)
        if self.reject_marker and any(self.reject_marker in str(i) for i in req.items):
            raise LLMError("endpoint answered 400: content refused", retriable=False, status=400)
        too_big = self.timeout_over is not None and len(req.items) > self.timeout_over
        if too_big or (self.timeout_marker and self.timeout_marker in str(req.items)):
            raise LLMError("LLM request timed out", retriable=True, timeout=True)
        text = self.sim.answer(req)
        return Completion(text, "stop", 10 * len(req.items), 5 * len(req.items), 0, 0.0)

    async def close(self) -> None:
        return None


class FakePublisher:
    """Keeps what would be published; can refuse a publish for good, like a broker."""

    def __init__(self) -> None:
        self.records: list[Any] = []
        self.refuse_next = 0

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    async def publish(self, records: list[Any], sent: Any = None) -> None:
        from instanced_stream.runtime.publish import PublishError

        if sent is not None:
            sent.handed()
        if self.refuse_next and records:
            # As the broker does: the first record is refused for good, the rest land.
            self.refuse_next -= 1
            self.records.extend(records[1:])
            raise PublishError(
                "broker refused a record (fake): MessageSizeTooLargeError", [records[0]]
            )
        self.records.extend(records)
