"""Turns a batch of instances into accepted calls: ask, validate, re-ask the missing.

Every instance ends in exactly one way: accepted calls (NoAction included), or unanswered
with a reason after `max_attempts` asks. A group that keeps failing as a whole is split in
halves, so one poison item cannot take its batch-mates down with it. An instance whose
answer asks to consult an on-demand advisor is decided again in a follow-up request with
that advisor active (a bounded number of rounds).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

from stream.core.messages import Call
from stream.core.model import Model
from stream.core.prompt import Ask, Instance, PromptBuilder, token_for
from stream.core.validate import Opinion, Refusal, Validator
from stream.errors import LLMError
from stream.testing.faults import crash_point

__all__ = ["Answer", "Outcome", "Solver", "Unanswered"]

log = logging.getLogger("stream.solve")


@dataclass(frozen=True, slots=True)
class Answer:
    instance: Instance
    calls: list[Call]
    token: str
    size: int
    attempt: int
    opinions: list[Opinion] = field(default_factory=list)
    consulted: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Unanswered:
    instance: Instance
    code: str
    reason: str
    attempts: int


@dataclass(slots=True)
class _Notes:
    """What the council said about one instance so far (a later round overrides)."""

    opinions: dict[str, Opinion] = field(default_factory=dict)
    consulted: list[str] = field(default_factory=list)


@dataclass(slots=True)
class Outcome:
    answers: list[Answer] = field(default_factory=list)
    unanswered: list[Unanswered] = field(default_factory=list)
    refusals: list[tuple[Refusal, Instance | None, int]] = field(default_factory=list)
    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    consults: int = 0
    stray_opinions: int = 0
    notes: dict[int, _Notes] = field(default_factory=dict)


class Solver:
    def __init__(
        self,
        llm: Model,
        prompt: PromptBuilder,
        validator: Validator,
        max_attempts: int,
        max_consults: int = 1,
    ) -> None:
        self.llm = llm
        self.prompt = prompt
        self.validator = validator
        self.max_attempts = max_attempts
        self.max_consults = max_consults

    async def solve(self, instances: list[Instance]) -> Outcome:
        outcome = Outcome()
        first = self.prompt.first_ask
        ask = Ask(first.active, first.consult and self.max_consults > 0)
        await self._solve(instances, outcome, 1, ask, 0)
        crash_point("solved")  # tests only (stream/faults.py): a bug in the guarded body
        return outcome

    async def _solve(
        self, group: list[Instance], out: Outcome, first_attempt: int, ask: Ask, rounds: int
    ) -> None:
        pending = group
        attempt = first_attempt
        reason, code = "no valid call for this instance", "unanswered"
        for attempt in range(first_attempt, first_attempt + self.max_attempts):
            tokens = [token_for(k) for k in range(len(pending))]
            try:
                done = await self.llm.complete(
                    self.prompt.messages(pending, ask),
                    self.prompt.response_format(len(pending), ask),
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
            verdict = self.validator.check(done.text, tokens, ask)
            by_token = dict(zip(tokens, pending, strict=True))
            self._note_opinions(out, verdict.opinions, by_token)
            out.stray_opinions += verdict.stray_opinions
            for refusal in verdict.refusals:
                owner = by_token.get(refusal.token) if refusal.token else None
                out.refusals.append((refusal, owner, attempt))
            for token, calls in verdict.calls.items():
                inst = by_token[token]
                notes = out.notes.get(id(inst), _Notes())
                out.answers.append(
                    Answer(
                        inst,
                        calls,
                        token,
                        len(pending),
                        attempt,
                        list(notes.opinions.values()),
                        notes.consulted,
                    )
                )
            if verdict.consults:
                await self._consult(verdict.consults, by_token, out, attempt, ask, rounds)
            answered = set(verdict.calls) | set(verdict.consults)
            pending = [by_token[t] for t in tokens if t not in answered]
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
                self._solve(pending[:half], out, attempt + 1, ask, rounds),
                self._solve(pending[half:], out, attempt + 1, ask, rounds),
            )
            return
        for instance in pending:
            out.unanswered.append(Unanswered(instance, code, reason, attempt))

    def _note_opinions(
        self, out: Outcome, opinions: list[Opinion], by_token: dict[str, Instance]
    ) -> None:
        for opinion in opinions:
            targets = [by_token[opinion.token]] if opinion.token else list(by_token.values())
            for inst in targets:
                out.notes.setdefault(id(inst), _Notes()).opinions[opinion.advisor] = opinion

    async def _consult(
        self,
        consults: dict[str, list[str]],
        by_token: dict[str, Instance],
        out: Outcome,
        attempt: int,
        ask: Ask,
        rounds: int,
    ) -> None:
        """Asks again, per set of consulted advisors, with those advisors active."""
        groups: dict[tuple[str, ...], list[Instance]] = {}
        for token, advisors in consults.items():
            inst = by_token[token]
            wanted = tuple(sorted(set(advisors)))
            out.notes.setdefault(id(inst), _Notes()).consulted.extend(wanted)
            out.consults += len(wanted)
            groups.setdefault(wanted, []).append(inst)
        for chosen, group in groups.items():
            follow = Ask(
                tuple(dict.fromkeys([*ask.active, *chosen])),
                rounds + 1 < self.max_consults,
            )
            await self._solve(group, out, attempt + 1, follow, rounds + 1)
