"""How many batches may be at the model at once: found by the stream, not hand-tuned.

Additive increase, multiplicative decrease (AIMD), as TCP finds a path's capacity:
every answered request adds 1/limit (one more slot per round trip) while the endpoint
is healthy; a 429, a 503 or a timeout cuts the limit to below the level that was
refused, and round trips that take twice their usual time cut it by a fifth. "Usual" is
kept per answer size (powers of two of the completion tokens): a window of 50 items
takes longer than one of 5 without anything being wrong. After a cut the limit creeps
back ten times slower above the level that failed, so an account's hard concurrency
limit is probed rarely, not every round trip. A retry-after pauses new requests until
it has passed. `window.max_in_flight` is the ceiling; with `window.adaptive: false` the
limit stays there.

The size of a request is learned the same way: a request that timed out halves the
number of instances a window may hold (`max_items`), and answers well inside the timeout
at that size let it grow by one, so windows shrink to what the endpoint answers in time.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

__all__ = ["Limiter"]

log = logging.getLogger("stream.limiter")

_CUT = 0.9  # after a refusal: at most this share of the limit
_SLOW_CUT = 0.8  # after latency doubled
_FAST, _SLOW = 0.3, 0.05  # EWMA weights: the slowdown signal, the usual round trip
_WARMUP = 5  # answers of a size before its usual round trip counts


class Limiter:
    def __init__(
        self,
        ceiling: int,
        *,
        adaptive: bool = True,
        initial: int | None = None,
        on_change: Callable[[float], None] | None = None,
    ) -> None:
        self.ceiling = ceiling
        self.adaptive = adaptive
        start = ceiling if not adaptive else min(ceiling, initial or max(1, ceiling // 2))
        self.limit = float(start)
        self.in_flight = 0
        self.cuts = 0
        self._plateau: float | None = None  # the level the endpoint last refused
        self._paused_until = 0.0
        self._last_cut = 0.0
        self._rtt = 0.0  # recent round trip, any size: the window for one cut
        self._usual: dict[int, tuple[int, float]] = {}  # size class -> (answers, seconds)
        self._slowdown = 1.0  # recent round trips over their size's usual, smoothed
        self._waiters: list[asyncio.Future[None]] = []
        self.max_items: int | None = None  # instances answered in time; None: no timeout yet
        self._on_change = on_change
        if on_change is not None:
            on_change(self.limit)

    @property
    def slots(self) -> int:
        return max(1, int(self.limit))

    async def acquire(self) -> None:
        while True:
            pause = self._paused_until - time.monotonic()
            if pause <= 0 and self.in_flight < self.slots:
                self.in_flight += 1
                return
            woken: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiters.append(woken)
            try:
                await asyncio.wait_for(woken, pause if pause > 0 else None)
            except TimeoutError:
                pass  # the pause is over: look again
            finally:
                if woken in self._waiters:
                    self._waiters.remove(woken)

    def release(self) -> None:
        # Synchronous, so a cancelled batch's `finally` can always give its slot back.
        self.in_flight -= 1
        self._wake()

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        for woken in waiters:
            if not woken.done():
                woken.set_result(None)

    def on_success(
        self,
        latency_s: float,
        completion_tokens: int = 0,
        items: int = 0,
        share_of_timeout: float = 0.0,
    ) -> None:
        if self.max_items is not None and items >= self.max_items and share_of_timeout < 0.5:
            self.max_items += 1
        self._rtt = latency_s if not self._rtt else self._rtt + _FAST * (latency_s - self._rtt)
        size = max(completion_tokens, 1).bit_length()
        seen, usual = self._usual.get(size, (0, latency_s))
        if seen >= _WARMUP and usual > 0:
            self._slowdown += _FAST * (latency_s / usual - self._slowdown)
        self._usual[size] = (seen + 1, usual + (_SLOW if seen else 1.0) * (latency_s - usual))
        if not self.adaptive:
            return
        if self._slowdown > 2 and time.monotonic() - self._last_cut > self._rtt:
            self._cut(self.limit * _SLOW_CUT, "round trips took twice their usual time")
            return
        step = 1.0 / self.limit
        if self._plateau is not None and self.limit + 1 >= self._plateau:
            step /= 10
        self._set(min(float(self.ceiling), self.limit + step))

    def on_overload(self, retry_after: float | None) -> None:
        """The endpoint refused (429/503) or timed out: back off, honour retry-after."""
        now = time.monotonic()
        if retry_after:
            self._paused_until = max(self._paused_until, now + retry_after)
        if not self.adaptive:
            return
        # Refusals of one burst arrive together: they are one signal, not several.
        if now - self._last_cut < max(self._rtt, 0.05):
            return
        # in_flight counts the refused batch itself: the others are what it bore.
        self._plateau = float(self.in_flight)
        self._cut(min(self.limit * _CUT, self.in_flight - 1.0), "endpoint refused")

    def on_timeout(self, items: int) -> None:
        """A request of `items` instances was not answered in time: windows shrink."""
        cap = max(1, items // 2)
        if self.max_items is None or cap < self.max_items:
            log.info("window size limit -> %d: a request of %d timed out", cap, items)
            self.max_items = cap

    def _cut(self, target: float, why: str) -> None:
        self._last_cut = time.monotonic()
        self.cuts += 1
        before = self.limit
        self._set(max(1.0, target))
        log.info("in-flight limit %.1f -> %.1f: %s", before, self.limit, why)

    def _set(self, value: float) -> None:
        changed = int(value) != int(self.limit)
        grew = int(value) > int(self.limit)
        self.limit = value
        if changed and self._on_change is not None:
            self._on_change(value)
        if grew:
            self._wake()
