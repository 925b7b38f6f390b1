"""An account's per-minute budget, as the simulator keeps it: the requests and tokens of
the last 60 s, whether one more fits, and OpenAI's `x-ratelimit-*` headers saying what is
left (the limit, the remaining count, and when the window is whole again).

OpenAI documents `x-ratelimit-reset-*` as the time until the limit "resets to its initial
state": here, when the newest request (or token spend) of the window leaves it, not the
oldest. A client that holds until then meets a whole budget; one that held only until the
oldest left would find room for one request and burst into 429s again."""

from __future__ import annotations

import time
from collections import deque

from instanced_stream_bench.testing.sim.account import SimConfig

__all__ = ["Quota"]


class Quota:
    def __init__(self) -> None:
        self.spent: deque[tuple[float, int]] = deque()  # (when, tokens) of the last 60 s
        self.sent: deque[float] = deque()  # when each request of the last 60 s came

    def _trim(self, now: float) -> None:
        while self.spent and self.spent[0][0] <= now - 60:
            self.spent.popleft()
        while self.sent and self.sent[0] <= now - 60:
            self.sent.popleft()

    def request(self, cfg: SimConfig) -> float | None:
        """Counts one request; the seconds until one fits when the minute is full."""
        if not cfg.requests_per_minute:
            return None
        now = time.monotonic()
        self._trim(now)
        if len(self.sent) >= cfg.requests_per_minute:
            return max(self.sent[0] + 60 - now, 0.05)
        self.sent.append(now)
        return None

    def tokens(self, cfg: SimConfig, tokens: int) -> float | None:
        """Spends `tokens`; when the minute's budget cannot take them: the seconds until
        enough frees."""
        if not cfg.tokens_per_minute:
            return None
        now = time.monotonic()
        self._trim(now)
        used = sum(n for _, n in self.spent)
        if used + tokens <= cfg.tokens_per_minute:
            self.spent.append((now, tokens))
            return None
        freed, wait = 0, 60.0
        for at, n in self.spent:
            freed += n
            if used - freed + tokens <= cfg.tokens_per_minute:
                wait = at + 60 - now
                break
        return max(wait, 0.05)

    def headers(self, cfg: SimConfig) -> dict[str, str]:
        """The account's `x-ratelimit-*` headers; the generic profile sends none."""
        if cfg.provider == "generic":
            return {}
        now = time.monotonic()
        self._trim(now)
        headers: dict[str, str] = {}
        if cfg.requests_per_minute:
            reset = (self.sent[-1] + 60 - now) if self.sent else 0.0
            headers |= {
                "x-ratelimit-limit-requests": str(cfg.requests_per_minute),
                "x-ratelimit-remaining-requests": str(
                    max(0, cfg.requests_per_minute - len(self.sent))
                ),
                "x-ratelimit-reset-requests": f"{max(reset, 0.0):.3f}s",
            }
        if cfg.tokens_per_minute:
            used = sum(n for _, n in self.spent)
            reset = (self.spent[-1][0] + 60 - now) if self.spent else 0.0
            headers |= {
                "x-ratelimit-limit-tokens": str(cfg.tokens_per_minute),
                "x-ratelimit-remaining-tokens": str(max(0, cfg.tokens_per_minute - used)),
                "x-ratelimit-reset-tokens": f"{max(reset, 0.0):.3f}s",
            }
        return headers
