"""The tier a stager is given: what happens to an item between the intake and its window,
and to the provider lines of a solved window. `ONLINE` windows every item and settles
nothing; the Batch API tier (`runtime/batch_api/submissions.py`) is the other."""

from __future__ import annotations

from typing import Protocol

from instanced_stream.kafka.records import OutRecord
from instanced_stream.runtime.pipeline.staged import Staged

__all__ = ["ONLINE", "Online", "Tier", "Windows"]


class Windows(Protocol):
    """What a tier may do with the windows (the windower, windows/windowing.py)."""

    async def add(self, item: Staged) -> None:
        """Into the open window."""

    async def launch(self, items: list[Staged], reason: str) -> None:
        """Straight to a batch of their own."""


class Tier(Protocol):
    """What happens to an item between the intake and its window, and to a solved window's
    provider lines. The stager is given one: `ONLINE`, or the Batch API tier
    (`runtime/batch_api/submissions.py`), which parks the items whose line is in a batch
    submitted before a restart and settles the lines of solved windows."""

    async def offer(self, item: Staged, windows: Windows) -> None:
        """`item` is ready for a window."""

    def settled(self, items: list[Staged]) -> dict[int, list[OutRecord]]:
        """Records that settle these solved items' lines, by id() of the carrying item."""


class Online:
    """The online tier: every item is windowed; there are no provider lines to settle."""

    async def offer(self, item: Staged, windows: Windows) -> None:
        await windows.add(item)

    def settled(self, items: list[Staged]) -> dict[int, list[OutRecord]]:
        return {}


ONLINE = Online()
