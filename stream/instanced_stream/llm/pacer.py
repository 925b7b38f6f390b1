"""Paces requests by the provider's own budget, so a 429 is the exception, not the
feedback loop. OpenAI, Azure OpenAI and others say on every answer how many requests and
tokens a minute the account may spend (`x-ratelimit-limit-requests`, `-tokens`), how
many are left (`x-ratelimit-remaining-*`) and when the window is whole again
(`x-ratelimit-reset-*`, e.g. `1s`, `6m0s`, `20ms`). Requests and tokens each go through a
leaky bucket (aiolimiter) sized by the limits, and when a remaining count reaches zero
nothing is sent until its reset. An endpoint that sends no such headers is not paced.
Beside it, `Limiter` still bounds the requests in flight.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Mapping

from aiolimiter import AsyncLimiter

__all__ = ["Pacer", "reset_seconds"]

_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")
_UNIT = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def reset_seconds(value: str | None) -> float | None:
    """`6m0s`, `1.5s`, `20ms` (OpenAI's form) or plain seconds, as seconds."""
    if not value:
        return None
    parts = _PART.findall(value)
    if parts:
        return sum(float(n) * _UNIT[u] for n, u in parts)
    try:
        return float(value)
    except ValueError:
        return None


def _count(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


class Pacer:
    def __init__(self) -> None:
        self.requests: AsyncLimiter | None = None
        self.tokens: AsyncLimiter | None = None
        self.hold_until = 0.0  # monotonic: a budget ran out; nothing is sent before
        self.waited_s = 0.0  # time requests spent waiting for the budget (a metric)

    def observe(self, headers: Mapping[str, str]) -> None:
        """Learns the limits and what is left of them from one answer's headers."""
        for kind in ("requests", "tokens"):
            limit = _count(headers.get(f"x-ratelimit-limit-{kind}"))
            bucket = getattr(self, kind)
            if limit and (bucket is None or bucket.max_rate != limit):
                setattr(self, kind, AsyncLimiter(limit, 60))
            left = _count(headers.get(f"x-ratelimit-remaining-{kind}"))
            reset = reset_seconds(headers.get(f"x-ratelimit-reset-{kind}"))
            if left == 0 and reset:
                self.hold_until = max(self.hold_until, time.monotonic() + reset)

    async def wait(self, tokens: int) -> None:
        """Until a request of about `tokens` tokens fits the account's budget."""
        started = time.monotonic()
        hold = self.hold_until - started
        if hold > 0:
            await asyncio.sleep(hold)
        if self.requests is not None:
            await self.requests.acquire()
        if self.tokens is not None:
            # A request larger than the whole minute's budget waits for a full bucket.
            await self.tokens.acquire(min(tokens, self.tokens.max_rate))
        self.waited_s += time.monotonic() - started
