"""Collects instances into batches: a window closes at its size (`Size.limit`: the most
items, or the items whose answers fit the output budget), its prompt tokens for items
(`Size.item_tokens`), or max wait after its first item, whichever comes first. The size
is read, never kept: `runtime/pipeline/windows/window_size.py` is its one author.

Counting an item's tokens exactly costs more than everything else done per item, and a
window rarely comes near its token budget: with `bound_of`, a cheap upper bound of an
item's tokens, items are counted exactly only when the bounds cannot prove they fit.

One window spans every partition this worker owns: at low traffic that fills requests
faster than one window per partition would. Order is kept because items enter in the
order the consumer delivers them, and a closed window is handed on before the next opens.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

__all__ = ["FixedSize", "Size", "Windower"]

T = TypeVar("T")

# Items a window holds at most, free ones included: the protocol numbers at most 500.
_MOST = 500

Flush = Callable[[list[T], str], Awaitable[None]]


class Size(Protocol):
    """What a window may hold, as the windower reads it at every item."""

    @property
    def item_tokens(self) -> int:
        """Prompt tokens the window's items may take."""

    def limit(self) -> tuple[int, str]:
        """Items the window may hold now, and the close reason when it is reached."""


@dataclass(slots=True)
class FixedSize:
    """A size that does not change: `items` items and `item_tokens` tokens."""

    items: int
    item_tokens: int

    def limit(self) -> tuple[int, str]:
        return self.items, "items"


class Windower(Generic[T]):
    def __init__(
        self,
        *,
        size: Size,
        max_wait_s: float,
        on_close: Flush[T],
        tokens_of: Callable[[T], int],
        bound_of: Callable[[T], int] | None = None,
        free: Callable[[T], bool] | None = None,
    ) -> None:
        self.size = size
        self.max_wait_s = max_wait_s
        self._on_close = on_close
        self._tokens_of = tokens_of
        self._bound_of = bound_of or tokens_of
        # An item that will not be asked (a twin, runtime/pipeline/windows/twins.py) takes no place.
        self._free = free
        self._spared = 0  # free items in the open window
        self._items: list[T] = []
        self._tokens = 0  # of the open window: exact, or an upper bound while `_loose`
        self._loose = False
        self._opened_at = 0.0
        self._lock = asyncio.Lock()
        self._opened = asyncio.Event()
        self._timer: asyncio.Task[None] | None = None

    def __len__(self) -> int:
        return len(self._items)

    async def add(self, item: T) -> None:
        """Adds an item; awaits the hand-over of any window it closes (backpressure)."""
        async with self._lock:
            cost, exact = self._cost(item)
            if self._items and self._tokens + cost > self.size.item_tokens:
                await self._close("tokens")
            if not self._items:
                self._opened_at = time.monotonic()
                self._opened.set()
            self._items.append(item)
            self._tokens += cost
            self._loose = self._loose or not exact
            self._spared += bool(self._free and self._free(item))
            most, reason = self.size.limit()
            if len(self._items) - self._spared >= most or len(self._items) >= _MOST:
                await self._close(reason)

    def _cost(self, item: T) -> tuple[int, bool]:
        """The item's tokens, and whether exactly: its bound while the open window's
        bounds prove it fits (the same decision as exact counts, since exact <= bound)."""
        if self._bound_of is self._tokens_of:
            return self._tokens_of(item), True
        bound = self._bound_of(item)
        if self._tokens + bound <= self.size.item_tokens:
            return bound, False
        if self._loose:
            self._tokens = sum(self._tokens_of(i) for i in self._items)
            self._loose = False
        return self._tokens_of(item), True

    async def launch(self, items: list[T], reason: str) -> None:
        """Hands `items` on as a window of their own, past the open one."""
        await self._on_close(items, reason)

    async def flush(self, reason: str = "flush") -> None:
        async with self._lock:
            if self._items:
                await self._close(reason)

    async def _close(self, reason: str) -> None:
        items, self._items, self._tokens, self._loose = self._items, [], 0, False
        self._spared = 0
        self._opened.clear()
        await self._on_close(items, reason)

    def start(self) -> None:
        self._timer = asyncio.create_task(self._run_timer(), name="window-timer")

    async def stop(self) -> None:
        if self._timer:
            self._timer.cancel()
            await asyncio.gather(self._timer, return_exceptions=True)

    async def _run_timer(self) -> None:
        while True:
            await self._opened.wait()
            opened_at = self._opened_at
            await asyncio.sleep(max(0.0, opened_at + self.max_wait_s - time.monotonic()))
            async with self._lock:
                # Only close the window this timer was armed for, not a newer one.
                if self._items and self._opened_at == opened_at:
                    await self._close("wait")
