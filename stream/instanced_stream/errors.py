"""One root for every error the product raises, each carrying data and a retriable flag.

Callers decide between "try again later" and "dead-letter it" by reading `retriable`
instead of matching exception types from three libraries.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "BadRecord",
    "InvalidCall",
    "KafkaUnreachable",
    "LLMError",
    "SpecError",
    "StreamError",
]


class StreamError(Exception):
    """Root of the product's errors."""

    retriable: bool = False

    def __init__(self, message: str, **data: Any) -> None:
        super().__init__(message)
        self.message = message
        self.data = data


class KafkaUnreachable(StreamError):
    """No broker answered at the address, or the TLS/SASL handshake failed."""

    retriable = True


class SpecError(StreamError):
    """The agent spec file is missing or invalid; raised at start-up, never mid-stream."""


class BadRecord(StreamError):
    """An input record that cannot become an instance (not JSON, no id, too large)."""

    def __init__(self, code: str, message: str, **data: Any) -> None:
        super().__init__(message, **data)
        self.code = code


class InvalidCall(StreamError):
    """A call in the model's answer that must not reach an activity topic."""

    def __init__(self, code: str, message: str, **data: Any) -> None:
        super().__init__(message, **data)
        self.code = code


class LLMError(StreamError):
    """The endpoint failed. Retriable errors pause the stream; the others fail the attempt."""

    def __init__(
        self,
        message: str,
        *,
        retriable: bool,
        status: int | None = None,
        retry_after: float | None = None,
        **data: Any,
    ) -> None:
        super().__init__(message, **data)
        self.retriable = retriable
        self.status = status
        self.retry_after = retry_after

    @property
    def timeout(self) -> bool:
        """No answer within the request timeout."""
        return bool(self.data.get("timeout"))

    @property
    def shape(self) -> bool:
        """The endpoint refused the request's shape (a parameter, the response format, the
        schema): a configuration error, never an item's fault."""
        return bool(self.data.get("shape"))

    @property
    def content(self) -> bool:
        """The endpoint refused what an item says (a content filter, a context overflow):
        splitting the request isolates the item."""
        return bool(self.data.get("content"))

    @property
    def server(self) -> bool:
        """The endpoint kept failing (5xx) on this request past the allowed attempts while
        it answered others: splitting may isolate an item it cannot take."""
        return bool(self.data.get("server"))

    @property
    def overload(self) -> bool:
        """The endpoint is busy (429, 503, or no answer in time): send it less."""
        return self.status in (429, 503) or self.timeout
