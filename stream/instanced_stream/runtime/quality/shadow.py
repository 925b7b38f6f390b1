"""The shadow sample: a share of the stream's items (`quality.shadow_rate`) is also
asked alone, in the background, and the lone decision is compared with the batched one
(`instanced_stream.core.decision`, the notion `stream eval` uses). Shadow answers never
publish anything; their requests, tokens and cost are counted (in the stream's totals
and apart), and the comparisons feed the agreement metric and, with
`quality.min_agreement`, the window controller, which sets the windower's size.

An answer given at window 1 needs no shadow: asking it alone again is the same request.
It counts as agreeing for the controller (so a window shrunk to 1 can grow back), and is
left out of the metric, which shows measured comparisons only.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable

from instanced_stream.core.controller import WindowController
from instanced_stream.core.decision import decision_of
from instanced_stream.core.live_spec import Edition, LiveSpec
from instanced_stream.core.model import Model
from instanced_stream.core.quality import bucket_of, z_of
from instanced_stream.core.solve import Answer, Outcome
from instanced_stream.errors import LLMError
from instanced_stream.observe.metrics import Metrics

__all__ = ["Shadow"]

log = logging.getLogger("stream.quality")

# Shadow requests at once, and waiting: a sample, never a second stream. Past the queue's
# bound a sampled item is dropped (counted), so shadows cannot hold the stream's memory.
_AT_ONCE = 2
_QUEUED = 64


class Shadow:
    def __init__(
        self,
        live: LiveSpec,
        llm: Model,
        metrics: Metrics,
        max_attempts: int,
        resize: Callable[[int], None],
        rng: random.Random | None = None,
    ) -> None:
        self.live = live  # the spec, read at each use
        self.llm = llm
        self.metrics = metrics
        self.max_attempts = max_attempts
        self.resize = resize  # tells the windower the controller's window
        self.rng = rng or random.Random()
        self.gate = asyncio.Semaphore(_AT_ONCE)
        self.tasks: set[asyncio.Task[None]] = set()
        self.controller: WindowController | None = None
        self._follow(live.edition)
        live.follow(self._follow)  # the controller learns across changes: told, not remade

    def _follow(self, edition: Edition) -> None:
        """The spec `edition` is live: the agreement's confidence and the controller's
        bounds follow it."""
        spec = edition.spec
        quality = spec.quality
        self.metrics.agreement.z = z_of(quality.confidence)
        if quality.min_agreement is None:
            self.controller = None
        elif self.controller is None:
            self.controller = WindowController(
                spec.window.max_items,
                quality.min_agreement,
                quality.min_sample,
                z_of(quality.confidence),
            )
        else:
            self.controller.resize(spec.window.max_items)
        self.metrics.agreement.window = self.window
        self.metrics.agreement.window_now.set(self.window)

    @property
    def window(self) -> int:
        return self.controller.window if self.controller else self.live.spec.window.max_items

    def offer(self, outcome: Outcome, edition: Edition) -> None:
        """A solved batch, asked on `edition` of the spec: its sampled answers are asked
        again alone, on the same edition (a comparison across two specs measures
        nothing)."""
        rate = edition.spec.quality.shadow_rate
        if not rate:
            return
        latest = {id(a.instance): a for a in outcome.answers}  # after consults: the last
        for answer in latest.values():
            if self.rng.random() >= rate:
                continue
            if answer.size <= 1:
                self._compared(1, True, measured=False)
            elif len(self.tasks) >= _QUEUED:
                self.metrics.agreement.shadow.labels("dropped").inc()
            else:
                task = asyncio.create_task(self._alone(answer, edition), name="shadow")
                self.tasks.add(task)
                task.add_done_callback(self.tasks.discard)

    async def _alone(self, answer: Answer, edition: Edition) -> None:
        spec = edition.spec
        try:
            async with self.gate:
                lone = await edition.solver(self.llm, self.max_attempts).solve([answer.instance])
        except LLMError as exc:
            log.info("shadow request failed, not compared: %s", exc.message)
            self.metrics.agreement.shadow.labels("unanswered").inc()
            return
        except Exception:  # a sample must never cost the stream: logged, not raised
            log.exception("shadow request failed")
            return
        prices = spec.model
        cost = prices.cost_usd(lone.prompt_tokens, lone.completion_tokens, lone.cached_tokens)
        self.metrics.agreement.asked_alone(
            lone.prompt_tokens, lone.completion_tokens, lone.cached_tokens, cost
        )
        # The bill is the bill: the stream's totals include what the sample cost.
        self.metrics.observe_tokens(
            lone.prompt_tokens, lone.completion_tokens, lone.cached_tokens, 0
        )
        self.metrics.count({"llm_requests": lone.requests})
        if not lone.answers:
            self.metrics.agreement.shadow.labels("unanswered").inc()
            return
        agreed = decision_of(lone.answers[-1].calls, spec) == decision_of(answer.calls, spec)
        self._compared(answer.size, agreed)

    def _compared(self, size: int, agreed: bool, measured: bool = True) -> None:
        if measured:
            self.metrics.agreement.compared_at(bucket_of(size), agreed)
        if self.controller is None:
            return
        change = self.controller.observe(size, agreed)
        if change is not None:
            level = logging.WARNING if change.new < change.old else logging.INFO
            log.log(level, change.why, extra={"quality": change.as_dict()})
            self.metrics.agreement.changed(change)
            self.resize(change.new)

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
