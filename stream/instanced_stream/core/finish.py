"""The seeds' `on: finish`: an advisor "consulted when determining if the loop needs to be
stopped". Its opinion is heard with the answer (the model writes both in one request), and
consulted per instance only where the loop decides whether that instance's workflow stops:

- the answer for the instance proposes no further call (no step: nothing but NoAction and
  thoughts): "stop" ends the workflow now, as the model's answer would; "continue" gives
  the instance another turn while its plan's turns remain (the loop would have stopped);
- its turn limit nears (the plan's last turn or the one before): "stop" ends the workflow
  now, and the calls of that answer are not run (each a dead letter `stopped`).

Elsewhere (calls proposed, turns to spare) its opinion is recorded and changes nothing. An
advisor defined per instance (`isInstanced`) speaks for its instance; one for the whole
request judged the request, and speaks for an instance only when the request held that
instance alone: it never stops, or keeps going, an instance it did not judge. A request
without a plan is one turn, its last: there a stop keeps the answer's calls from running.
The prompt says all of this (`instructions.FINISH`).
"""

from __future__ import annotations

from typing import Literal

from instanced_stream.core import lazy
from instanced_stream.core.advice import Vote, aggregate, parse_votes
from instanced_stream.core.messages import Call
from instanced_stream.core.spec import AgentSpec
from instanced_stream.core.validate import Opinion

__all__ = ["Moment", "Say", "moment", "say"]

Say = Literal["stop", "continue"]
Moment = Literal["no_call", "limit"]


def say(spec: AgentSpec, opinions: list[Opinion], alone: bool) -> Say | None:
    """What the finish advisors that judged this instance say, weighed as a council:
    "stop" when it leads with at least 50, "continue" when that does; None when neither
    (or none spoke). `alone`: the request held this instance only (a request-wide
    opinion judged it)."""
    votes = []
    for op in opinions:
        advisor = spec.advisor(op.advisor)
        scores, _ = parse_votes(op.votes_raw)
        judged = op.token is not None or alone
        if advisor and advisor.on == "finish" and scores and op.error is None and judged:
            votes.append(Vote(op.advisor, advisor.weight, scores))
    if not votes:
        return None
    shares = aggregate(votes).distribution
    stop, go = shares.get("stop", 0.0), shares.get("continue", 0.0)
    if stop >= max(0.5, go):
        return "stop"
    return "continue" if go >= 0.5 else None


def moment(spec: AgentSpec, turn: int, calls: list[tuple[str, Call]]) -> Moment | None:
    """Whether this turn of an instance is one where the loop decides to stop, and why;
    None: it goes on whatever a finish advisor says."""
    if spec.plan is None or turn >= spec.plan.max_turns - 1:
        return "limit"
    if not any(lazy.is_step(spec, c) for _, c in calls):
        return "no_call"
    return None
