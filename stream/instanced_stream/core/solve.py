"""Turns a batch of instances into accepted calls: ask, validate, re-ask the missing.

Every instance ends in exactly one way: accepted calls (NoAction included), or unanswered
with a reason after `max_attempts` asks. A re-ask names what was wrong with the last
answer, after the cached prefix, so the model can correct itself. A group that keeps
failing as a whole, whose request timed out, kept failing with 5xx or was refused for
its content (a 400 that names no parameter), is split in halves, so one poison item
or a window too large for the endpoint's time limit cannot hold its batch-mates. An
instance whose answer asks to consult an on-demand advisor is decided again in a
follow-up request with that advisor active (a bounded number of rounds).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any

from instanced_stream.core.advice import parse_votes
from instanced_stream.core.messages import Call
from instanced_stream.core.model import Model
from instanced_stream.core.prompt import Ask, Instance, PromptBuilder, token_for
from instanced_stream.core.spec import NO_ACTION, AgentSpec
from instanced_stream.core.validate import Opinion, Refusal, Validator, Verdict, input_text
from instanced_stream.errors import LLMError

__all__ = ["Answer", "Outcome", "Solver", "Unanswered"]

log = logging.getLogger("stream.solve")

# The NoAction reason of an instance a valid answer left without calls (spec silence).
_SILENCE_REASON = "no call: the spec says silence means no action"


@dataclass(frozen=True, slots=True)
class Answer:
    instance: Instance
    calls: list[Call]
    token: str
    size: int
    attempt: int
    opinions: list[Opinion] = field(default_factory=list)
    consulted: list[str] = field(default_factory=list)
    questions: list[tuple[str, str]] = field(default_factory=list)  # (advisor, question)
    unheard: list[str] = field(default_factory=list)  # active instanced advisors silent on it


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
    questions: list[tuple[str, str]] = field(default_factory=list)  # (advisor, question)
    reasked_advice: bool = False  # asked again once for a missing instanced opinion


@dataclass(slots=True)
class Outcome:
    answers: list[Answer] = field(default_factory=list)
    unanswered: list[Unanswered] = field(default_factory=list)
    refusals: list[tuple[Refusal, Instance | None, int]] = field(default_factory=list)
    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    reasoning_tokens: int = 0  # of completion_tokens
    consults: int = 0
    stray_opinions: int = 0
    latencies: list[float] = field(default_factory=list)
    notes: dict[int, _Notes] = field(default_factory=dict)
    spared: int = 0  # instances answered without asking: twins (runtime/pipeline/windows/twins.py)


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
        """Instances on different turns hear different advisors (the seeds' `on`), and an
        advisor defined for one instance speaks about that one only, so a batch that
        mixes them is asked once per set of speaking advisors."""
        outcome = Outcome()
        groups: dict[Ask, list[Instance]] = {}
        for inst in instances:
            ask = self.prompt.ask_for(inst.turn, bool(inst.rejected), inst.id)
            groups.setdefault(ask, []).append(inst)
        for chosen, group in groups.items():
            ask = Ask(chosen.active, chosen.consult and self.max_consults > 0, chosen.planning)
            await self._solve(group, outcome, 1, ask, 0)
        return outcome

    async def _solve(
        self,
        group: list[Instance],
        out: Outcome,
        first_attempt: int,
        ask: Ask,
        rounds: int,
        since: float | None = None,
    ) -> None:
        """`since`: when the request this group was split from failed; an answer the
        endpoint gave after it shows the endpoint works and the group is the problem."""
        pending = group
        attempt = first_attempt
        failed_at = since
        code, reason = "unanswered", "no valid call for this instance"
        feedback: dict[int, str] = {}
        for attempt in range(first_attempt, first_attempt + self.max_attempts):
            try:
                pending, feedback = await self._ask(
                    pending, out, attempt, ask, rounds, feedback, since
                )
                ask = _heard_once(self.prompt.spec, ask, pending, out)
            except LLMError as exc:
                out.requests += 1
                failed_at = time.monotonic()
                if exc.timeout or exc.server:
                    # The endpoint answers others but not this request: smaller ones may
                    # pass, and one item it never takes is isolated by the halving.
                    code, reason = (
                        ("llm_timeout", f"no answer in time: {exc.message}")
                        if exc.timeout
                        else ("llm_error", exc.message)
                    )
                    if len(pending) > 1:
                        break
                    continue  # one item the endpoint fails on, while it answers others
                # Refused for what an item says (a content filter, a context overflow):
                # the same request fails the same way, so split at once to find the item,
                # which is dead-lettered with the endpoint's own words.
                code, reason = "llm_rejected", exc.message
                break
            if not pending:
                return
            code, reason = "unanswered", next(iter(feedback.values()), reason)
        if len(pending) > 1:
            half = len(pending) // 2
            # One half after the other: they share the batch's one in-flight slot.
            await self._solve(pending[:half], out, attempt + 1, ask, rounds, failed_at)
            await self._solve(pending[half:], out, attempt + 1, ask, rounds, failed_at)
            return
        for instance in pending:
            out.unanswered.append(Unanswered(instance, code, reason, attempt))

    async def _ask(
        self,
        pending: list[Instance],
        out: Outcome,
        attempt: int,
        ask: Ask,
        rounds: int,
        feedback: dict[int, str],
        since: float | None = None,
    ) -> tuple[list[Instance], dict[int, str]]:
        """One request: records what it settled; returns the instances still open and
        why each is open (keyed by id(instance)), for the next ask to say."""
        tokens = [token_for(k) for k in range(len(pending))]
        notes = [
            (t, feedback[id(i)]) for t, i in zip(tokens, pending, strict=True) if id(i) in feedback
        ]
        questions = [
            (t, advisor, question)
            for t, i in zip(tokens, pending, strict=True)
            for advisor, question in (out.notes[id(i)].questions if id(i) in out.notes else [])
        ]
        heard = _heard_before(self.prompt.spec, ask, pending, out)
        done = await self.llm.complete(
            self.prompt.messages(pending, ask, notes, questions, heard),
            self.prompt.response_format(len(pending), ask),
            items=len(pending),
            max_tokens=self.prompt.output_cap(len(pending)),
            since=since,
            keys=tuple(i.key for i in pending),
        )
        out.requests += 1
        out.prompt_tokens += done.prompt_tokens
        out.completion_tokens += done.completion_tokens
        out.cached_tokens += done.cached_tokens
        out.reasoning_tokens += done.reasoning_tokens
        out.latencies.append(done.latency_s)
        # Its size only: the answer holds thoughts, which are never kept (the seeds).
        log.debug("answer to %d (%s): %d chars", len(pending), done.finish_reason, len(done.text))
        by_token = dict(zip(tokens, pending, strict=True))
        inputs = {t: input_text(i.payload) for t, i in by_token.items()}
        names = {i.id: t for t, i in by_token.items()}
        states = {t: i.state or {} for t, i in by_token.items()}
        verdict = self.validator.check(done.text, tokens, ask, inputs, names, states)
        self._note_opinions(out, verdict.opinions, by_token)
        out.stray_opinions += verdict.stray_opinions
        why: dict[str, str] = {}
        for refusal in verdict.refusals:
            owner = by_token.get(refusal.token) if refusal.token else None
            out.refusals.append((refusal, owner, attempt))
            if refusal.token:
                why.setdefault(refusal.token, f"{refusal.code}: {refusal.reason}")
        unheard = _unheard(self.prompt.spec, verdict, by_token, out, ask, why)
        for token, calls in verdict.calls.items():
            inst = by_token[token]
            notes_of = out.notes.get(id(inst), _Notes())
            out.answers.append(
                Answer(
                    inst,
                    calls,
                    token,
                    len(pending),
                    attempt,
                    list(notes_of.opinions.values()),
                    notes_of.consulted,
                    notes_of.questions,
                    unheard.get(token, []),
                )
            )
        if verdict.consults:
            await self._consult(verdict.consults, by_token, out, attempt, ask, rounds)
        answered = set(verdict.calls) | set(verdict.consults)
        if self.prompt.spec.silence == "no_action" and not verdict.malformed:
            answered |= self._silent(verdict, tokens, by_token, out, attempt, set(why))
        left = [t for t in tokens if t not in answered]
        default = verdict.malformed or "no valid call for this instance"
        if done.finish_reason == "length":
            default = f"answer truncated at the output limit; {default}"
        if left:
            # Codes only: a refusal's reason may quote the answer, which may quote an item.
            codes = Counter(why[t].split(":", 1)[0] if t in why else "unanswered" for t in left)
            log.info(
                "ask %d left %d of %d instances unanswered (%s): %s",
                attempt,
                len(left),
                len(tokens),
                ", ".join(f"{c} {n}" for c, n in codes.most_common()),
                default,
            )
        return [by_token[t] for t in left], {id(by_token[t]): why.get(t, default) for t in left}

    def _silent(
        self,
        verdict: Verdict,
        tokens: list[str],
        by_token: dict[str, Instance],
        out: Outcome,
        attempt: int,
        refused: set[str],
    ) -> set[str]:
        """Spec `silence: no_action`: an instance a complete answer left without any call
        (and without a refused one, which is asked again) needs nothing."""
        if verdict.cut_short:
            return set()
        silent = [t for t in tokens if t not in verdict.calls and t not in verdict.consults]
        silent = [t for t in silent if t not in refused]
        for token in silent:
            inst = by_token[token]
            call = Call.model_validate(
                {"_tool": NO_ACTION, "_instance": token, "reason": _SILENCE_REASON}
            )
            notes_of = out.notes.get(id(inst), _Notes())
            out.answers.append(
                Answer(
                    inst,
                    [call],
                    token,
                    len(tokens),
                    attempt,
                    list(notes_of.opinions.values()),
                    notes_of.consulted,
                    notes_of.questions,
                )
            )
        return set(silent)

    def _note_opinions(
        self, out: Outcome, opinions: list[Opinion], by_token: dict[str, Instance]
    ) -> None:
        for opinion in opinions:
            targets = [by_token[opinion.token]] if opinion.token else list(by_token.values())
            for inst in targets:
                out.notes.setdefault(id(inst), _Notes()).opinions[opinion.advisor] = opinion

    async def _consult(
        self,
        consults: dict[str, list[tuple[str, str]]],
        by_token: dict[str, Instance],
        out: Outcome,
        attempt: int,
        ask: Ask,
        rounds: int,
    ) -> None:
        """Asks again, per set of consulted advisors, with those advisors active."""
        groups: dict[tuple[str, ...], list[Instance]] = {}
        for token, asked in consults.items():
            inst = by_token[token]
            wanted = tuple(sorted({advisor for advisor, _ in asked}))
            notes = out.notes.setdefault(id(inst), _Notes())
            notes.consulted.extend(wanted)
            # The consulted advisor gets the model's question (the seeds' ConsultAdvisor).
            notes.questions.extend(asked)
            out.consults += len(wanted)
            groups.setdefault(wanted, []).append(inst)
        for chosen, group in groups.items():
            follow = Ask(
                tuple(dict.fromkeys([*ask.active, *chosen])),
                rounds + 1 < self.max_consults,
                ask.planning,
            )
            await self._solve(group, out, attempt + 1, follow, rounds + 1)


def _heard_once(spec: AgentSpec, ask: Ask, pending: list[Instance], out: Outcome) -> Ask:
    """A non-instanced advisor speaks once about a request (in a stream, its window):
    once its opinion is recorded for the instances still open, their re-asks and
    splits go without it. Asking it again cost every re-ask a whole opinion, and on
    a small model that opinion was where answers ran on to the output cap."""
    heard = {
        a
        for a in ask.active
        if (advisor := spec.advisor(a)) is not None
        and not advisor.is_instanced
        and all(
            (notes := out.notes.get(id(i))) is not None
            and (o := notes.opinions.get(a)) is not None
            and o.error is None
            for i in pending
        )
    }
    if not heard or not pending:
        return ask
    return replace(ask, active=tuple(a for a in ask.active if a not in heard))


def _heard_before(
    spec: AgentSpec, ask: Ask, pending: list[Instance], out: Outcome
) -> list[dict[str, Any]]:
    """The opinions request-wide advisors gave earlier about the instances asked again,
    as the model wrote them: not asked again (`_heard_once`), they are still shown, so
    the re-asked instances are decided with the advice the seeds say comes first."""
    shown = []
    for advisor in spec.advisors:
        if advisor.is_instanced or advisor.id in ask.active:
            continue
        for inst in pending:
            notes = out.notes.get(id(inst))
            opinion = notes.opinions.get(advisor.id) if notes is not None else None
            if opinion is not None and opinion.error is None and opinion.token is None:
                shown.append({"id": advisor.id, **opinion.fields, "calls": opinion.votes_raw})
                break
    return shown


def _unheard(
    spec: AgentSpec,
    verdict: Verdict,
    by_token: dict[str, Instance],
    out: Outcome,
    ask: Ask,
    why: dict[str, str],
) -> dict[str, list[str]]:
    """Active instanced advisors without a valid opinion on an answered instance. Where
    the advice gates, the first time the instance is asked again (like a skipped one:
    its calls are not taken); the second time its calls are taken, and the advisors
    named as unheard (the gate then fails closed). Where it only records, the calls
    are taken at once and the silence recorded: a re-ask would buy a record with a
    request, and on a small model the re-asks of long council answers ran on and
    multiplied (the seeds' advisors example went from 95 s to over 400 s)."""
    gates = spec.advice.mode == "gate"
    instanced = [
        a.id for a in (spec.advisor(i) for i in ask.active) if a is not None and a.is_instanced
    ]
    out_of: dict[str, list[str]] = {}
    for token in list(verdict.calls):
        notes = out.notes.setdefault(id(by_token[token]), _Notes())
        heard = {
            a
            for a, o in notes.opinions.items()
            if o.error is None and parse_votes(o.votes_raw)[0] is not None
        }
        silent = [a for a in instanced if a not in heard]
        if not silent:
            continue
        if gates and not notes.reasked_advice:
            notes.reasked_advice = True
            verdict.calls.pop(token)
            why[token] = f"advisors {silent} gave no valid opinion on this instance"
        else:
            out_of[token] = silent
    return out_of
