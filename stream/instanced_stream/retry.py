"""The one back-off policy of every retry loop: the model endpoint, publishing, a batch's
delivery and an activity handler. Each loop keeps its own rule for what to retry; how
long to wait is decided here."""

from __future__ import annotations

import random
from dataclasses import dataclass

__all__ = ["RetryPolicy"]


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    base_s: float = 0.25
    cap_s: float = 30.0

    def delay(self, attempt: int, retry_after: float | None = None) -> float:
        """Seconds before try `attempt + 1`. Full jitter keeps many workers from hammering
        a recovering service in step; a server's retry-after is honoured (capped)."""
        # The exponent is bounded: 2**1024 overflows a float, which a retry loop that
        # never gives up (an outage of some hours at the cap) would otherwise reach.
        backoff = random.uniform(0, min(self.cap_s, self.base_s * 2 ** min(attempt, 64)))
        if retry_after is not None:
            return min(self.cap_s, max(retry_after, 0.0)) + backoff * 0.1
        return backoff
