"""The spec's `budget` section, a spend ceiling, and the pacer that keeps to it.

Spend is what the model's tokens cost at the spec's prices, as `stream bench` prices them
(cached prompt tokens at their price, Batch API lines at the batch price): the
processor's `instanced_stream_cost_usd_total`. The pacer is a generic cell rate
algorithm in dollars: each dollar spent moves a theoretical time on by 1/rate seconds,
and a new request may start while that time is at most `burst_s` ahead of now. Requests
in flight count at the mean cost of the last ones until their cost is known, so a window
of concurrent requests cannot overshoot. Pacing holds input (backpressure): nothing is
dropped or dead-lettered for budget.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["Budget", "Pacer"]

_RATE_WINDOW_S = 300.0  # the spend rate shown: over the last five minutes


class Budget(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    usd_per_hour: float | None = Field(
        None, gt=0, description="Spend ceiling per hour (model tokens at the spec's prices)"
    )
    usd_per_day: float | None = Field(None, gt=0, description="Spend ceiling per day")
    burst_s: float = Field(
        60.0,
        gt=0,
        description="Spend that may run ahead of the ceiling's even pace, in seconds of it "
        "(after a quiet spell the processor may spend this much at once)",
    )

    @property
    def usd_per_s(self) -> float | None:
        """The tighter of the ceilings, as an even rate."""
        hour = self.usd_per_hour / 3600 if self.usd_per_hour else None
        day = self.usd_per_day / 86400 if self.usd_per_day else None
        rates = [r for r in (hour, day) if r is not None]
        return min(rates) if rates else None


class Pacer:
    """Keeps spend at or under `budget`'s rate; `clock` in seconds (monotonic)."""

    def __init__(self, budget: Budget, clock: Callable[[], float] = time.monotonic) -> None:
        self.budget = budget
        self.clock = clock
        self._due = clock()  # the theoretical time of the spend so far
        self._spent = 0.0  # the cumulative spend last recorded
        self._flying = 0  # requests started, cost not yet recorded
        self._mean = 0.0  # a request's cost, learnt
        self._history: deque[tuple[float, float]] = deque()  # (when, cumulative spend)
        # This processor's part of the group's ceiling: the share of the input partitions
        # it owns, so the processors of a group together keep to the spec's ceiling.
        self.share = 1.0

    @property
    def limited(self) -> bool:
        return self.budget.usd_per_s is not None

    @property
    def usd_per_s(self) -> float | None:
        """The rate this processor keeps to: its share of the ceiling (None: no ceiling)."""
        rate = self.budget.usd_per_s
        return None if rate is None else rate * self.share

    def owns(self, partitions: int, of: int) -> None:
        """The processor owns `partitions` of the `of` input partitions now. A share of
        none leaves a trickle (a thousandth), so a pacer never divides by zero."""
        self.share = max(partitions / of, 1e-3) if of > 0 else 1.0

    def delay(self) -> float:
        """Seconds until the next request may start (0: now)."""
        rate = self.usd_per_s
        if rate is None:
            return 0.0
        now = self.clock()
        ahead = max(self._due, now) + self._flying * self._mean / rate - now
        return max(0.0, ahead - self.budget.burst_s)

    def started(self) -> None:
        self._flying += 1

    def ended(self, total_usd: float) -> None:
        """A request ended; `total_usd`: the spend so far (every source of it counted)."""
        self._flying = max(0, self._flying - 1)
        self.record(total_usd)

    def record(self, total_usd: float) -> None:
        now = self.clock()
        spent, self._spent = max(0.0, total_usd - self._spent), max(total_usd, self._spent)
        if spent:
            self._mean = spent if not self._mean else 0.8 * self._mean + 0.2 * spent
        rate = self.usd_per_s
        if rate is not None:
            self._due = max(self._due, now) + spent / rate
        self._history.append((now, self._spent))
        while len(self._history) > 2 and self._history[1][0] < now - _RATE_WINDOW_S:
            self._history.popleft()

    def rate_per_hour(self) -> float:
        """The spend rate over the last minutes, USD per hour."""
        if len(self._history) < 2:
            return 0.0
        (t0, s0), (t1, s1) = self._history[0], self._history[-1]
        return 3600 * (s1 - s0) / (t1 - t0) if t1 > t0 else 0.0

    def headroom_per_hour(self) -> float | None:
        """The ceiling's rate less the spend rate now, USD per hour (None: no ceiling)."""
        rate = self.usd_per_s
        return None if rate is None else max(0.0, 3600 * rate - self.rate_per_hour())

    def met_in_s(self) -> float | None:
        """When the ceiling will be met at the spend rate now: 0 while paced; None when
        there is no ceiling or the spend is within it."""
        rate = self.usd_per_s
        if rate is None:
            return None
        if self.delay() > 0:
            return 0.0
        now_rate = self.rate_per_hour() / 3600
        if now_rate <= rate:
            return None
        # The burst allowance left, drained at the spend above the ceiling's rate.
        ahead = max(self._due - self.clock(), 0.0)
        return (self.budget.burst_s - ahead) * rate / (now_rate - rate)
