"""The central domain object: one instance of a batch, as the protocol sees it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from instanced_stream.core.messages import SourcePosition

__all__ = ["Instance"]


@dataclass(frozen=True, slots=True)
class Instance:
    """One input item of a batch: the producer's id, its data, and where it came from."""

    id: str
    payload: dict[str, Any]
    source: SourcePosition
    size: int
    state: dict[str, Any] | None = None  # the instance's state, shown to the model
    turn: int = 1  # 1 for the input itself; a stateful workflow's later turns count on
    plan: list[dict[str, Any]] | None = None  # the plan's steps so far, shown to the model
    # A lazy plan's rejected versions with their reasons: this turn plans again.
    rejected: list[dict[str, Any]] | None = None

    @property
    def key(self) -> str:
        """Which record and turn this is, the same after a restart: `topic/p/offset/turn`."""
        s = self.source
        return f"{s.topic}/{s.partition}/{s.offset}/{self.turn}"
