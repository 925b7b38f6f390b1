"""The spend ceiling kept (the spec's `budget`, core/budget.py): before each request the
stager waits here while the pacer says the ceiling would be passed. The wait is taken in
the window's hand-over, so the windower, the intake and the consumer's fetching wait
with it: input is held (lag grows), never dropped or dead-lettered for budget, and what
is published stays exactly once. Readiness does not follow it: a paced pod is healthy.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from instanced_stream.core.budget import Budget, Pacer
from instanced_stream.observe.metrics import Metrics

__all__ = ["Spend"]

_NAP_S = 1.0  # the longest single wait: a spend recorded meanwhile is seen within it


class Spend:
    def __init__(
        self, budget: Budget, metrics: Metrics, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.pacer = Pacer(budget, clock)
        self.metrics = metrics
        self.clock = clock
        self._show(False)

    async def wait(self) -> None:
        """Returns when a request may start, and counts it as started."""
        held = False
        while (delay := self.pacer.delay()) > 0:
            if not held:
                held = True
                self._show(True)
            nap = min(delay, _NAP_S)
            await asyncio.sleep(nap)
            self.metrics.spend.paced_seconds.inc(nap)
        self.pacer.started()
        if held:
            self._show(False)

    def ended(self) -> None:
        """A request ended: its cost is in the metrics' spend now."""
        self.pacer.ended(self.metrics.cost)
        self._show(self.pacer.delay() > 0)

    def owns(self, partitions: int, of: int) -> None:
        """After a rebalance: the processor paces to its share of the ceiling."""
        self.pacer.owns(partitions, of)
        self._show(self.pacer.delay() > 0)

    def _show(self, paced: bool) -> None:
        pacer, gauges = self.pacer, self.metrics.spend
        rate = pacer.usd_per_s  # its share of the ceiling: summed over a group, the ceiling
        headroom, met_in = pacer.headroom_per_hour(), pacer.met_in_s()
        gauges.rate.set(pacer.rate_per_hour())
        gauges.ceiling.set(3600 * rate if rate else 0)
        gauges.headroom.set(headroom or 0)
        gauges.met_in.set(-1 if met_in is None else met_in)
        gauges.paced.set(int(paced))
        gauges.live.update(
            usd_per_hour=round(3600 * rate, 6) if rate else None,
            spend_usd_per_hour=round(pacer.rate_per_hour(), 6),
            headroom_usd_per_hour=None if headroom is None else round(headroom, 6),
            met_in_s=None if met_in is None else round(met_in, 1),
            paced=paced,
        )
