"""The simulator's "judgement": how it answers our multi-instance request (as
`request.py` reads it). It is not a language model: a trained classifier
(alt-profanity-check, whose model ships in its wheel) plus spam rules decide moderation;
advisor personas, plan steps and routed instructions follow simple rules; markers in an
item force per-instance faults."""

from __future__ import annotations

import hashlib
import logging
import random
import re
from collections import Counter
from functools import lru_cache
from typing import Any

import orjson
from instanced_stream.core.compact import REASONING, compress

from instanced_stream_bench.testing.sim.account import SimConfig
from instanced_stream_bench.testing.sim.obedience import injected_calls
from instanced_stream_bench.testing.sim.planner import ORDERS, fill, lazy_steps, plan_step
from instanced_stream_bench.testing.sim.request import SimRequest
from instanced_stream_bench.testing.sim.routing import choose_tool, route_instruction
from instanced_stream_bench.testing.sim.wording import reasoning_for, why_for

__all__ = ["Judge", "plan_order"]

log = logging.getLogger("stream.simulator")

# Matched on the lower-cased text: IGNORECASE took 6x as long (an instant simulator must be cheap)
_SPAM = re.compile(
    r"https?://|www\.|buy now|free money|click here|limited offer|\$\$\$|subscribe to my"
    r"|cheap (?:watches|pills|followers)|earn \d+"
)
_RUDE = re.compile(r"\b(idiot|moron|stupid|fuck\w*|shit|loser|clown|hell)\b")
_REPEAT = re.compile(r"(.)\1{7,}")
_MARKER = re.compile(r"\[\[sim:([a-z-]+)\]\]")


def _views(items: list[dict[str, Any]]) -> dict[Any, dict[str, Any]]:
    """Each token's messages, merged: its input and its state (in the order given)."""
    views: dict[str, dict[str, Any]] = {}
    for item in items:
        view = views.setdefault(item["_instance"], {"input": {}, "state": {}})
        if item.get("type") == "plan":  # the instance's plan so far (stateful turns)
            view["plan"] = item.get("steps") or []
            continue
        body = {k: v for k, v in item.items() if k not in ("type", "_instance")}
        view["state" if item.get("type") == "state" else "input"].update(body)
        if item.get("type") == "state" and not view["input"]:
            view["input"] = dict(body)
    return views


def _vote_options(tools: list[dict[str, Any]]) -> tuple[str, str]:
    """What the council votes on: approve/reject when the main tool chooses between them,
    else the first two tools."""
    props = tools[0].get("parameters", {}).get("properties", {}) if tools else {}
    for schema in props.values():
        if {"approve", "reject"} <= set(schema.get("enum", [])):
            return "approve", "reject"
    names = [t["name"] for t in tools] + ["NoAction"]
    return names[0], names[1]


@lru_cache(maxsize=65536)
def _is_spam(text: str) -> bool:
    letters = sum(map(str.isalpha, text))
    shouting = letters >= 12 and sum(map(str.isupper, text)) / letters > 0.7
    return bool(_SPAM.search(text.lower())) or shouting or _REPEAT.search(text) is not None


def plan_order(config: SimConfig, req: SimRequest) -> str:
    """The order this request's plans are written in: the configured one, or under
    `mixed` one chosen from the request's items (the same request, the same order; a
    stream's requests get all of them)."""
    if config.plan_order != "mixed":
        return config.plan_order
    digest = hashlib.blake2b(orjson.dumps(req.items), digest_size=4).digest()
    return ORDERS[int.from_bytes(digest, "big") % len(ORDERS)]


class Judge:
    """Answers requests like a model would, deterministically for a seed."""

    def __init__(self, config: SimConfig | None = None) -> None:
        self.config = config or SimConfig()
        self.rng = random.Random(self.config.seed)
        self.stats: Counter[str] = Counter()
        self._seen_skip_once: set[str] = set()
        self._predict: Any = None
        self._scores: dict[str, float] = {}

    def toxicity(self, texts: list[str]) -> list[float]:
        if self._predict is None and self.config.classifier:
            try:
                from profanity_check import predict_prob  # loads the bundled sklearn model
            except ImportError:  # the `testing` extra is not installed (e.g. the image)
                log.warning("alt-profanity-check is not installed: judging by word rules")
                self.config = self.config.model_copy(update={"classifier": False})
            else:
                self._predict = predict_prob
        if not self.config.classifier:
            # Word rules only: for measuring the processor, not the model's judgement.
            return [0.9 if _RUDE.search(t.lower()) else 0.1 for t in texts]
        # Remembered per text: the classifier is the simulator's main cost, and a fast
        # simulator must not be what limits a benchmark of the processor.
        new = list(dict.fromkeys(t for t in texts if t not in self._scores))
        if new:
            if len(self._scores) > 200_000:
                self._scores.clear()
            self._scores.update(zip(new, (float(p) for p in self._predict(new)), strict=True))
        return [self._scores[t] for t in texts]

    def solve(self, req: SimRequest) -> dict[str, Any]:
        """The solution: advisors' opinions first (when any are active), then calls."""
        faults = self.config.faults
        views = _views(req.items)
        if req.instruction:
            return {"calls": route_instruction(req, views)}
        texts = [
            " ".join(str(v) for k, v in item.items() if k not in ("type", "_instance"))
            for item in (view["input"] for view in views.values())
        ]
        scores = self.toxicity(texts)
        real = [t for t in req.tools if t["name"] not in ("NoAction", "ConsultAdvisor")]
        options = _vote_options(real)
        on_demand = [a["id"] for a in req.advisors if a.get("on") is None]
        calls: list[Any] = []
        judged: list[tuple[str, str, float, bool, set[str]]] = []
        for (token, view), text, score in zip(views.items(), texts, scores, strict=True):
            markers = set(_MARKER.findall(text))
            if "skip-always" in markers or self.rng.random() < faults.skip_rate:
                self.stats["fault_skip"] += 1
                continue
            if "skip-once" in markers and text not in self._seen_skip_once:
                self._seen_skip_once.add(text)
                self.stats["fault_skip"] += 1
                continue
            spam = _is_spam(text)
            flagged = score > 0.5 or spam
            judged.append((token, text, score, flagged, markers))
            if "noaction" in markers:
                calls.append(
                    {
                        "_tool": "NoAction",
                        "_instance": token,
                        "_reasoningForCall": "nothing to do",
                        "reason": "marked",
                    }
                )
                continue
            unsure = 0.35 < score < 0.65 or "consult" in markers
            if req.may_consult and on_demand and unsure:
                self.stats["consults"] += 1
                calls.append(
                    {
                        "_tool": "ConsultAdvisor",
                        "_instance": token,
                        "_reasoningForCall": "borderline; a second opinion helps",
                        "advisor": on_demand[0],
                        "question": "Is this acceptable?",
                    }
                )
                continue
            why = why_for(spam, flagged, terse=bool(req.call_fields))
            if any(t.get("paths") or t.get("kind") == "latent" for t in real):
                latent = {t["name"] for t in real if t.get("kind") == "latent"}
                order = plan_order(self.config, req)
                self.stats[f"plan_order.{order}"] += 1  # per instance planned
                if "Mode lazy" in req.system:
                    steps = lazy_steps(token, view, real, text, order)
                else:
                    steps = plan_step(token, view, real, text, order)
                calls += self._spoil_once(steps, text, markers, latent)
                continue
            choice = choose_tool(real, text)
            if choice is not None:
                calls.append(
                    {
                        "_tool": choice[0],
                        "_instance": token,
                        "_reasoningForCall": f"the council's top option is {choice[0]}",
                    }
                )
                continue
            for pos, tool in enumerate(real):
                if pos > 0 and not flagged:
                    continue  # follow-up tools act on flagged items only
                args = fill(tool.get("parameters", {}), "", flagged, why, bool(req.call_fields))
                call = {
                    "_tool": tool["name"],
                    "_instance": token,
                    "_reasoningForCall": reasoning_for(
                        req.call_fields, req.reasoning, score, why, spam, flagged
                    ),
                    **(args if isinstance(args, dict) else {}),
                }
                if pos == 0 and ("bad-args" in markers or self.rng.random() < faults.bad_args_rate):
                    self.stats["fault_bad_args"] += 1
                    call = {**call, **dict.fromkeys(args, 12345)} if args else {**call, "x": 1}
                if pos == 0 and (
                    "unknown-tool" in markers or self.rng.random() < faults.unknown_tool_rate
                ):
                    self.stats["fault_unknown_tool"] += 1
                    call["_tool"] = "deleteEverything"
                calls.append(call)
            if "invent" in markers or self.rng.random() < faults.invent_rate:
                self.stats["fault_invent"] += 1
                calls.append(
                    {**calls[-1], "_instance": "⑨⑨"}
                    if calls
                    else {"_tool": real[0]["name"], "_instance": "⑨⑨"}
                )
        opinions = self._opinions(req, judged, options)
        return {"advisors": opinions, "calls": calls} if req.advisors else {"calls": calls}

    def _spoil_once(
        self, calls: list[dict[str, Any]], text: str, markers: set[str], latent: set[str]
    ) -> list[dict[str, Any]]:
        """Markers for the meta properties: the first answer about the item writes an
        output path outside †state (bad-path), a scope that does not exist (bad-scope)
        or a latent write with two paths (latent-branch); later answers get it right, as
        a model told its mistake would."""
        spoil = {"bad-path", "bad-scope", "latent-branch"} & markers
        if not spoil or not calls or text in self._seen_skip_once:
            return calls
        self._seen_skip_once.add(text)
        awaited = next((c for c in calls if c.get("_outputPath")), calls[0])
        if "bad-path" in spoil:
            awaited["_outputPath"] = "state.customer"
        if "bad-scope" in spoil:
            awaited["_scopes"] = ["inputs.body"]
        for call in calls:
            if "latent-branch" in spoil and call.get("_outputPath") and call["_tool"] in latent:
                call["_outputPath"] += " || †state.notes"  # a latent write left undecided
        return calls

    def _opinions(
        self,
        req: SimRequest,
        judged: list[tuple[str, str, float, bool, set[str]]],
        options: tuple[str, str],
    ) -> list[dict[str, Any]]:
        """Advisor personas: a strict lens (safety, risk, legal) rejects earlier than a
        lenient one (community, growth), so borderline items get divergent votes."""
        out: list[dict[str, Any]] = []
        if not judged:
            return out
        for advisor in req.advisors:
            if advisor["id"] not in req.active:
                continue
            lens = f"{advisor['id']} {advisor.get('role', '')}".lower()
            bias = (
                1.6
                if re.search(r"safety|risk|secur|legal|strict", lens)
                else (0.6 if re.search(r"communit|growth|lenient|engage", lens) else 1.0)
            )
            targets = (
                judged
                if advisor.get("isInstanced")
                else [
                    (
                        "",
                        " ".join(j[1] for j in judged),
                        sum(j[2] for j in judged) / len(judged),
                        any(j[3] for j in judged),
                        set().union(*(j[4] for j in judged)),
                    )
                ]
            )
            for token, seen, score, flagged, markers in targets:
                reject = min(1.0, score * bias + (0.5 if flagged and score < 0.5 else 0.0))
                if "disagree" in markers:
                    reject = 0.0 if flagged else 1.0
                votes: Any = {
                    options[0]: round(100 * (1 - reject)),
                    options[1]: round(100 * reject),
                }
                choice = choose_tool(req.tools, seen)
                if choice is not None:
                    votes = choice[1]
                if "low-votes" in markers:
                    # One option, low confidence: 10 is not certainty, however alone.
                    votes = {options[0]: 10}
                if advisor.get("on") == "finish":
                    # The loop's question (the prompt names the options): stop when an
                    # item says so, else go on.
                    stop = 90 if "stop" in markers else 10
                    votes = {"stop": stop, "continue": 100 - stop}
                votes_text = orjson.dumps(votes).decode()
                if "bad-votes" in markers or self.rng.random() < self.config.faults.bad_votes_rate:
                    self.stats["fault_bad_votes"] += 1
                    votes_text = "{" + f"{options[0]}: ten, {options[1]}: lots"
                view = f"{advisor['id']} reads a risk of {reject:.2f}"
                fields = fill(advisor.get("schema", {}), "", reject > 0.5, view)
                opinion = {
                    "id": advisor["id"],
                    **(fields if isinstance(fields, dict) else {}),
                    "calls": votes_text,
                }
                if advisor.get("isInstanced"):
                    opinion["_instance"] = token
                out.append(opinion)
        self.stats["opinions"] += len(out)
        return out

    def answer(self, req: SimRequest) -> str:
        """The answer text, in the form the request asks for; an item marked poison
        spoils the whole answer, as a model sometimes does when one input derails it."""
        if any("[[sim:poison]]" in orjson.dumps(item).decode() for item in req.items):
            self.stats["fault_poison"] += 1
            return '{"calls": [{"_tool": "oops'
        solution = self.solve(req)
        if self.config.obedient:
            real = [t for t in req.tools if t["name"] not in ("NoAction", "ConsultAdvisor")]
            injected = injected_calls(req.items, real)
            self.stats["obeyed_injections"] += len(injected)
            solution["calls"] = [*injected, *solution["calls"]]
        if req.reasoning == "off":
            solution["calls"] = [
                {k: v for k, v in c.items() if k != REASONING} for c in solution["calls"]
            ]
        if req.call_fields:
            solution["calls"] = compress(solution["calls"], req.call_fields)
        return orjson.dumps(solution).decode()
