"""Quality control: what happens between a batch's answer and its records. The shadow
sample measures the batched decisions and moves the window's size (through its one author,
`WindowSize`); second opinions for doubtful items replace their answers before anything
is published."""

from __future__ import annotations

from instanced_stream.core.live_spec import Edition, LiveSpec
from instanced_stream.core.model import Model
from instanced_stream.core.solve import Outcome
from instanced_stream.observe.metrics import Metrics
from instanced_stream.runtime.pipeline.windows.window_size import WindowSize
from instanced_stream.runtime.quality.escalation import Escalation
from instanced_stream.runtime.quality.shadow import Shadow

__all__ = ["QualityControl"]


class QualityControl:
    def __init__(
        self,
        live: LiveSpec,
        llm: Model,
        metrics: Metrics,
        max_attempts: int,
        size: WindowSize,
        second: Model | None = None,
    ) -> None:
        self.size = size
        self.shadow = Shadow(live, llm, metrics, max_attempts, size.follow_quality)
        self.escalation = Escalation(llm, metrics, max_attempts, second)
        size.follow_quality(self.shadow.window)
        live.follow(self._follow)  # after the shadow's own: its window follows the spec first

    def _follow(self, _edition: Edition) -> None:
        self.size.follow_quality(self.shadow.window)

    async def after(self, outcome: Outcome, edition: Edition) -> None:
        """A solved batch, asked on `edition` of the spec: sampled (its batched answers, as
        given), then its doubtful answers replaced by their second opinions."""
        self.shadow.offer(outcome, edition)
        await self.escalation.review(outcome, edition)

    async def stop(self) -> None:
        await self.shadow.stop()
