"""Turns a batch of instances into accepted calls: ask, validate, re-ask the missing.

Every instance ends in exactly one way: accepted calls (NoAction included), or unanswered
with a reason after `max_attempts` asks. A group that keeps failing as a whole is split in
halves, so one poison item cannot take its batch-mates down with it.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

from stream.errors import LLMError
from stream.llm import LLM
from stream.models import Call
from stream.prompt import Instance, PromptBuilder, token_for
from stream.validate import Refusal, Validator

__all__ = ["Answer", "Outcome", "Solver", "Unanswered"]

log = logging.getLogger("stream.solve")


@dataclass(frozen=True, slots=True)
class Answer:
    instance: Instance
    calls: list[Call]
    token: str
    size: int
    attempt: int


@dataclass(frozen=True, slots=True)
class Unanswered:
    instance: Instance
    code: str
    reason: str
    attempts: int


@dataclass(slots=True)
class Outcome:
    answers: list[Answer] = field(default_factory=list)
    unanswered: list[Unanswered] = field(default_factory=list)
    refusals: list[tuple[Refusal, Instance | None, int]] = field(default_factory=list)
    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0


class Solver:
    def __init__(
        self, llm: LLM, prompt: PromptBuilder, validator: Validator, max_attempts: int
    ) -> None:
        self.llm = llm
        self.prompt = prompt
        self.validator = validator
        self.max_attempts = max_attempts

    async def solve(self, instances: list[Instance]) -> Outcome:
        outcome = Outcome()
        await self._solve(instances, outcome, first_attempt=1)
        return outcome

    async def _solve(self, group: list[Instance], out: Outcome, first_attempt: int) -> None:
        pending = group
        attempt = first_attempt
        reason, code = "no valid call for this instance", "unanswered"
        for attempt in range(first_attempt, first_attempt + self.max_attempts):
            tokens = [token_for(k) for k in range(len(pending))]
            try:
                done = await self.llm.complete(
                    self.prompt.messages(pending), self.prompt.response_format(len(pending))
                )
            except LLMError as exc:
                # Not retriable (e.g. 400): the same request will fail the same way, so
                # split at once to find the item that causes it.
                out.requests += 1
                reason, code = exc.message, "llm_rejected"
                break
            out.requests += 1
            out.prompt_tokens += done.prompt_tokens
            out.completion_tokens += done.completion_tokens
            out.cached_tokens += done.cached_tokens
            verdict = self.validator.check(done.text, tokens)
            by_token = dict(zip(tokens, pending, strict=True))
            for refusal in verdict.refusals:
                owner = by_token.get(refusal.token) if refusal.token else None
                out.refusals.append((refusal, owner, attempt))
            for token, calls in verdict.calls.items():
                out.answers.append(Answer(by_token[token], calls, token, len(pending), attempt))
            pending = [by_token[t] for t in verdict.missing(tokens)]
            if not pending:
                return
            reason, code = verdict.malformed or "no valid call for this instance", "unanswered"
            if done.finish_reason == "length":
                reason = f"answer truncated at the output limit; {reason}"
            log.info(
                "ask %d left %d of %d instances unanswered: %s",
                attempt,
                len(pending),
                len(tokens),
                reason,
            )
        if len(pending) > 1:
            half = len(pending) // 2
            await asyncio.gather(
                self._solve(pending[:half], out, attempt + 1),
                self._solve(pending[half:], out, attempt + 1),
            )
            return
        for instance in pending:
            out.unanswered.append(Unanswered(instance, code, reason, attempt))
