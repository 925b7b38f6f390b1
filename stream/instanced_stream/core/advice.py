"""Weighted tool selection: parse the advisors' inline-JSON votes, weight them, and
reduce a council's opinions about one instance to a consensus and a divergence figure.

Pure functions over plain data, so the arithmetic is testable on its own. Malformed votes
are data too: they are recorded with the reason and left out of the sum, never raised.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from instanced_stream.core.messages import Call, OpinionRecord
from instanced_stream.core.spec import AdviceSettings, AgentSpec
from instanced_stream.core.validate import Opinion

__all__ = ["Consensus", "Vote", "aggregate", "gate", "parse_votes", "render", "summarise"]


@dataclass(frozen=True, slots=True)
class Vote:
    """One advisor's opinion: its confidence (0-1) in each option it scored (tools or
    values); `shares` keeps its old name for the records' sake."""

    advisor: str
    weight: float
    shares: dict[str, float]


@dataclass(frozen=True, slots=True)
class Consensus:
    option: str | None
    score: float
    divergence: float
    distribution: dict[str, float]
    advisors: int

    def as_dict(self) -> dict[str, Any]:
        return {
            "option": self.option,
            "score": round(self.score, 4),
            "divergence": round(self.divergence, 4),
            "distribution": {k: round(v, 4) for k, v in sorted(self.distribution.items())},
            "advisors": self.advisors,
        }


def parse_votes(raw: Any) -> tuple[dict[str, float] | None, str | None]:
    """Inline JSON like '{"deploy": 10, "rollback": 5, "delay": 95}' -> each option's
    confidence from 0 to 1 (the score / 100).

    The seeds' votes are independent confidence scores, not shares of one ballot: they
    need not sum to 100, and a lone '{"approve": 10}' is low confidence, not certainty.
    Returns (scores, None) or (None, reason). Numbers given as strings are accepted;
    negative, non-finite, non-numeric or above-100 votes are refused.
    """
    if isinstance(raw, dict):
        data: Any = raw
    elif isinstance(raw, str):
        try:
            data = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            return None, f"votes are not JSON: {exc}"
    else:
        return None, f"votes must be a JSON string, got {type(raw).__name__}"
    if not isinstance(data, dict) or not data:
        return None, "votes must be a non-empty JSON object of option -> number"
    scores: dict[str, float] = {}
    for option, value in data.items():
        try:
            number = float(value)
        except (TypeError, ValueError):
            return None, f"vote for {option!r} is not a number: {value!r}"
        if not math.isfinite(number) or not 0 <= number <= 100:
            return None, f"vote for {option!r} must be a number from 0 to 100, got {value!r}"
        scores[str(option)] = number / 100
    return scores, None


def aggregate(votes: Sequence[Vote]) -> Consensus:
    """Weighted mean confidence per option; an option an advisor did not score counts as
    0 from that advisor.

    `score` is the consensus option's mean confidence (so a council that is only 10%
    sure of its best option says 0.1); `divergence` is the weighted mean, over advisors,
    of the largest gap between the advisor's confidence and the council's on any
    option: 0 when unanimous, never above 1 (two opposed, certain advisors of equal
    weight: 0.5).
    """
    counted = [v for v in votes if v.weight > 0 and v.shares]
    total = sum(v.weight for v in counted)
    if not counted or total <= 0:
        return Consensus(None, 0.0, 0.0, {}, 0)
    options = sorted({o for v in counted for o in v.shares})
    mean = {o: sum(v.weight * v.shares.get(o, 0.0) for v in counted) / total for o in options}
    # Ties go to the alphabetically first option, so the result never depends on order.
    # A tie is equal means up to rounding: the same council with its weights scaled or
    # its advisors reordered sums in another order, and must not change its choice.
    top = max(mean.values())
    best = min(o for o in options if math.isclose(mean[o], top, rel_tol=1e-9, abs_tol=1e-12))
    divergence = (
        sum(v.weight * max(abs(v.shares.get(o, 0.0) - mean[o]) for o in options) for v in counted)
        / total
    )
    return Consensus(best, mean[best], divergence, mean, len(counted))


def summarise(
    spec: AgentSpec, opinions: Sequence[Opinion], instanced_only: bool = False
) -> tuple[list[OpinionRecord], Consensus]:
    """The opinions about one instance as records, and the weighted consensus of those
    that vote on the calls. `instanced_only`: the consensus of the opinions about this
    instance alone: a non-instanced advisor's one opinion is about the whole request (in
    a stream, an arbitrary window of items), so it is recorded, never a gate on one
    item's call, unless the spec says it gates (`gates`): then it gates every instance
    of its request."""
    records: list[OpinionRecord] = []
    votes: list[Vote] = []
    for opinion in sorted(opinions, key=lambda o: o.advisor):
        advisor = spec.advisor(opinion.advisor)
        weight = advisor.weight if advisor else 0.0
        shares, error = parse_votes(opinion.votes_raw)
        error = opinion.error or error
        # A finish advisor scores stop/continue for the loop (the workflow reads it),
        # not the calls: recorded, kept out of the calls' consensus.
        about_calls = advisor is None or advisor.on != "finish"
        mine = opinion.token is not None or not instanced_only or bool(advisor and advisor.gates)
        if shares is not None and opinion.error is None and about_calls and mine:
            votes.append(Vote(opinion.advisor, weight, shares))
        records.append(
            OpinionRecord(
                advisor=opinion.advisor,
                weight=weight,
                instanced=opinion.token is not None,
                fields=opinion.fields,
                votes=None if shares is None else {k: round(v, 4) for k, v in shares.items()},
                votes_raw=opinion.votes_raw,
                error=error,
            )
        )
    return records, aggregate(votes)


def _options(call: Call) -> set[str]:
    """What a call chooses: its tool, and the string values of its arguments."""
    return {call.tool} | {v for v in call.arguments.values() if isinstance(v, str)}


def gate(call: Call, consensus: Consensus, settings: AdviceSettings) -> str | None:
    """Why this call must go to review instead of its activity topic, or None.

    Only calls that choose among the options the council voted on are judged: a call
    against a clear consensus, or one taken where the council reached no consensus.
    """
    if settings.mode != "gate" or consensus.option is None:
        return None
    voted_on = _options(call) & set(consensus.distribution)
    if not voted_on:
        return None
    if consensus.score < settings.min_score:
        return f"no consensus: {consensus.option} at {consensus.score:.2f} < {settings.min_score}"
    if consensus.option not in voted_on and consensus.score >= settings.clear_score:
        return (
            f"against the council: it favours {consensus.option} at {consensus.score:.2f}, "
            f"the call chose {sorted(voted_on)}"
        )
    return None


def render(records: Sequence[dict[str, Any]], colour: bool = False) -> str:
    """Advice records as text for people: the decision, each advisor's votes, and a loud
    mark where the council diverged or a call was held for review."""

    def loud(text: str) -> str:
        return f"\x1b[1;33m{text}\x1b[0m" if colour else text

    lines: list[str] = []
    for rec in records:
        consensus = rec.get("consensus", {})
        flags = []
        if rec.get("divergent"):
            flags.append(loud(f"DIVERGENT {consensus.get('divergence', 0):.2f}"))
        if rec.get("reviewed"):
            flags.append(loud(f"{len(rec['reviewed'])} held for review"))
        if rec.get("consulted"):
            flags.append("consulted " + ", ".join(rec["consulted"]))
        lines.append(
            f"{rec.get('instance')}  -> {consensus.get('option')} "
            f"({consensus.get('score', 0):.2f})  {'  '.join(flags)}".rstrip()
        )
        for op in rec.get("opinions", []):
            votes = op.get("votes")
            shown = (
                " ".join(f"{k}={v:.2f}" for k, v in sorted(votes.items()))
                if votes
                else f"unusable votes: {op.get('error')}"
            )
            thought = next((str(v) for v in op.get("fields", {}).values()), "")
            lines.append(f"    {op['advisor']:<18} w={op['weight']:<4} {shown}  {thought[:70]}")
    return "\n".join(lines)
