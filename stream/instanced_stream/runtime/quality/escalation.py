"""Second opinions for doubtful items (`quality.escalate_on`), before anything of theirs
is published: an instance whose advisors diverged (the consensus figure the advice
records carry, past `advice.divergence_alert`) or whose answer took more than one ask
is asked again alone, of `model.escalate` where set (else the stream's own model), and
that answer is the one published. Escalations and their tokens and cost are counted.

An instance answered alone by the stream's own model has had that opinion already: it is
escalated only to a second model.
"""

from __future__ import annotations

import logging

from instanced_stream.core.advice import summarise
from instanced_stream.core.live_spec import Edition
from instanced_stream.core.model import Model
from instanced_stream.core.solve import Answer, Outcome
from instanced_stream.core.spec import AgentSpec
from instanced_stream.errors import LLMError
from instanced_stream.observe.metrics import Metrics

__all__ = ["Escalation"]

log = logging.getLogger("stream.quality")


class Escalation:
    """Keeps no spec: each review is of one batch, on the edition it was asked on."""

    def __init__(
        self,
        llm: Model,
        metrics: Metrics,
        max_attempts: int,
        second: Model | None = None,
    ) -> None:
        self.llm = second or llm
        self.second = second is not None
        self.metrics = metrics
        self.max_attempts = max_attempts

    def doubtful(self, answer: Answer, spec: AgentSpec) -> bool:
        on = spec.quality.escalate_on
        if on == "never" or (answer.size <= 1 and not self.second):
            return False
        if on == "reask":
            return answer.attempt > 1
        _, consensus = summarise(spec, answer.opinions)
        return consensus.advisors > 0 and consensus.divergence >= spec.advice.divergence_alert

    async def review(self, outcome: Outcome, edition: Edition) -> None:
        """Replaces each doubtful answer of `outcome` (asked on `edition` of the spec) by
        its second opinion, asked on the same edition, in place."""
        spec = edition.spec
        solver = edition.solver(self.llm, self.max_attempts, max_consults=0)
        for k, answer in enumerate(outcome.answers):
            if not self.doubtful(answer, spec):
                continue
            try:
                again = await solver.solve([answer.instance])
            except LLMError as exc:
                log.info("second opinion failed, the first stands: %s", exc.message)
                continue
            cost = spec.model.cost_usd(
                again.prompt_tokens, again.completion_tokens, again.cached_tokens
            )
            self.metrics.agreement.escalated(cost)
            self.metrics.observe_tokens(
                again.prompt_tokens, again.completion_tokens, again.cached_tokens, 0
            )
            self.metrics.count({"llm_requests": again.requests})
            if again.answers:
                outcome.answers[k] = again.answers[-1]
