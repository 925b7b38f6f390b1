"""What happens between a batch's answer and its records (`quality.*`): the shadow
sample, which measures the batched decisions and sets the window's size, and second
opinions for doubtful items, which replace their answers before anything is published."""

from __future__ import annotations

import functools
from typing import Any

from instanced_stream.core.model import Model
from instanced_stream.core.solve import Outcome
from instanced_stream.core.spec import AgentSpec
from instanced_stream.ops.metrics import Metrics
from instanced_stream.runtime.escalation import Escalation
from instanced_stream.runtime.shadow import Shadow
from instanced_stream.runtime.windowing import Windower

__all__ = ["Review"]


class Review:
    def __init__(
        self,
        spec: AgentSpec,
        llm: Model,
        metrics: Metrics,
        max_attempts: int,
        windower: Windower[Any],
        second: Model | None = None,
    ) -> None:
        self.windower = windower
        resize = functools.partial(setattr, windower, "max_items")
        self.shadow = Shadow(spec, llm, metrics, max_attempts, resize)
        self.escalation = Escalation(spec, llm, metrics, max_attempts, second)
        windower.max_items = self.shadow.window

    def reconfigure(self, spec: AgentSpec) -> None:
        self.shadow.reconfigure(spec)
        self.escalation.reconfigure(spec)
        self.windower.max_items = self.shadow.window

    async def after(self, outcome: Outcome) -> None:
        """A solved batch: sampled (its batched answers, as given), then its doubtful
        answers replaced by their second opinions."""
        self.shadow.offer(outcome)
        await self.escalation.review(outcome)

    async def stop(self) -> None:
        await self.shadow.stop()
