"""An OpenAI-compatible LLM SIMULATOR. It is not a language model.

It stands in for a model where none is reachable: it reads our multi-instance request,
decides moderation with a real trained classifier (alt-profanity-check, whose model ships
in its wheel) plus spam rules, answers with a solution valid for the requested schema,
reports token usage (and prompt-prefix cache hits), and injects faults for tests.

Faults: per-request switches (`next`: a queue of "429", "500", "401", "403", "404",
"hang", "malformed", "truncated"), rates for the same and for per-instance faults, and
markers in an item's text that force a per-instance fault deterministically:
`[[sim:skip-once]]`, `[[sim:skip-always]]`, `[[sim:unknown-tool]]`, `[[sim:invent]]`,
`[[sim:bad-args]]`, `[[sim:noaction]]`, `[[sim:poison]]` (spoils any answer that
includes the item, so only splitting the batch can isolate it), and for advisors
`[[sim:consult]]` (asks the first on-demand advisor), `[[sim:disagree]]` (the council
votes against the decision) and `[[sim:bad-votes]]` (malformed inline JSON).
`[[sim:slow=SECONDS]]` delays the answer of every request that contains the item.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import random
import re
import threading
import time
from collections import Counter, deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import orjson
from aiohttp import web
from pydantic import BaseModel, Field

from stream.core.state import read_path
from stream.core.tokenizer import estimate_tokens

__all__ = ["Faults", "SimConfig", "SimRequest", "Simulator", "running_simulator", "serve"]

log = logging.getLogger("stream.simulator")

MODEL_NAME = "stream-sim-1"
_SPAM = re.compile(
    r"https?://|www\.|buy now|free money|click here|limited offer|\$\$\$|subscribe to my"
    r"|cheap (?:watches|pills|followers)|earn \d+",
    re.IGNORECASE,
)
_RUDE = re.compile(r"\b(idiot|moron|stupid|fuck\w*|shit|loser|clown|hell)\b", re.IGNORECASE)
_MARKER = re.compile(r"\[\[sim:([a-z-]+)\]\]")
_REFUSALS = {
    "401": "Incorrect API key provided (simulated)",
    "403": "This key has no access to the model (simulated)",
    "404": f"The model does not exist; this endpoint serves {MODEL_NAME} (simulated)",
}
_SLOW = re.compile(r"\[\[sim:slow=(\d+(?:\.\d+)?)\]\]")


class Faults(BaseModel):
    next: list[str] = Field(default_factory=list, description="Request faults, used in order")
    rate_limit_rate: float = 0.0
    error_rate: float = 0.0
    hang_rate: float = 0.0
    malformed_rate: float = 0.0
    skip_rate: float = 0.0
    invent_rate: float = 0.0
    unknown_tool_rate: float = 0.0
    bad_args_rate: float = 0.0
    bad_votes_rate: float = 0.0
    retry_after_s: float = 1.0
    hang_s: float = 3600.0


class SimConfig(BaseModel):
    """How the simulated endpoint behaves: latency like a real one (a fixed part plus a
    part per output token), and an account's limits (0: none)."""

    latency_ms: float = 0.0
    per_output_token_ms: float = 0.0
    jitter: float = Field(0.0, ge=0, le=1, description="latency varies by up to this share")
    max_concurrency: int = Field(0, ge=0, description="requests at once; more get a 429")
    tokens_per_minute: int = Field(0, ge=0, description="prompt + completion tokens per 60 s")
    limit_retry_after_s: float = Field(0.25, ge=0, description="retry-after of a busy 429")
    classifier: bool = Field(
        True, description="judge with the trained classifier; off: cheap word rules only"
    )
    seed: int = 7
    faults: Faults = Field(default_factory=Faults)
    api_key: str | None = Field(
        None, description="the one key accepted (401 for others, as a real account); None: any"
    )


@dataclass(frozen=True, slots=True)
class SimRequest:
    system: str
    tools: list[dict[str, Any]]
    items: list[dict[str, Any]]
    advisors: list[dict[str, Any]]
    active: tuple[str, ...]
    may_consult: bool
    instruction: str = ""


def _views(items: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each token's messages, merged: its input and its state (in the order given)."""
    views: dict[str, dict[str, Any]] = {}
    for item in items:
        view = views.setdefault(str(item["_instance"]), {"input": {}, "state": {}})
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
    return bool(_SPAM.search(text)) or shouting or re.search(r"(.)\1{7,}", text) is not None


class Simulator:
    def __init__(self, config: SimConfig | None = None) -> None:
        self.config = config or SimConfig()
        self.rng = random.Random(self.config.seed)
        self.stats: Counter[str] = Counter()
        self._seen_prefixes: set[bytes] = set()
        self._seen_skip_once: set[str] = set()
        self._predict: Any = None
        self._active = 0  # requests being answered now
        self._spent: deque[tuple[float, int]] = deque()  # (when, tokens) of the last 60 s
        self._scores: dict[str, float] = {}

    # -- the model's "judgement" --------------------------------------------------
    def _toxicity(self, texts: list[str]) -> list[float]:
        if not self.config.classifier:
            # Word rules only: for measuring the processor, not the model's judgement.
            return [0.9 if _RUDE.search(t) else 0.1 for t in texts]
        if self._predict is None:
            from profanity_check import predict_prob  # loads the bundled sklearn model

            self._predict = predict_prob
        # Remembered per text: the classifier is the simulator's main cost, and a fast
        # simulator must not be what limits a benchmark of the processor.
        new = list(dict.fromkeys(t for t in texts if t not in self._scores))
        if new:
            if len(self._scores) > 200_000:
                self._scores.clear()
            self._scores.update(zip(new, (float(p) for p in self._predict(new)), strict=True))
        return [self._scores[t] for t in texts]

    def _fill(self, schema: dict[str, Any], name: str, flagged: bool, why: str) -> Any:
        if "anyOf" in schema:
            branch: dict[str, Any] = next(
                (s for s in schema["anyOf"] if s.get("type") != "null"), {}
            )
            return self._fill(branch, name, flagged, why)
        if "enum" in schema:
            options = list(schema["enum"])
            if {"approve", "reject"} <= set(options):
                return "reject" if flagged else "approve"
            return options[0] if flagged else options[-1]
        kind = schema.get("type")
        if kind == "string":
            if name == "message":
                return f"Your comment was removed: {why}."
            return why
        if kind in ("number", "integer"):
            return 1 if flagged else 0
        if kind == "boolean":
            return flagged
        if kind == "array":
            return []
        if kind == "object":
            props = schema.get("properties", {})
            return {k: self._fill(v, k, flagged, why) for k, v in props.items()}
        return None

    def solve(self, req: SimRequest) -> dict[str, Any]:
        """The solution: advisors' opinions first (when any are active), then calls."""
        faults = self.config.faults
        views = _views(req.items)
        if req.instruction:
            return {"calls": self._route_instruction(req, views)}
        texts = [
            " ".join(str(v) for k, v in item.items() if k not in ("type", "_instance"))
            for item in (view["input"] for view in views.values())
        ]
        scores = self._toxicity(texts)
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
            why = (
                ("spam" if spam else "insulting or profane language")
                if flagged
                else ("within the community rules")
            )
            if any(t.get("paths") or t.get("kind") == "latent" for t in real):
                calls += self._plan_step(token, view, real, text)
                continue
            for pos, tool in enumerate(real):
                if pos > 0 and not flagged:
                    continue  # follow-up tools act on flagged items only
                args = self._fill(tool.get("parameters", {}), "", flagged, why)
                call = {
                    "_tool": tool["name"],
                    "_instance": token,
                    "_reasoningForCall": f"toxicity {score:.2f}; {why}",
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
                        "",
                        sum(j[2] for j in judged) / len(judged),
                        any(j[3] for j in judged),
                        set().union(*(j[4] for j in judged)),
                    )
                ]
            )
            for token, _, score, flagged, markers in targets:
                reject = min(1.0, score * bias + (0.5 if flagged and score < 0.5 else 0.0))
                if "disagree" in markers:
                    reject = 0.0 if flagged else 1.0
                votes: Any = {
                    options[0]: round(100 * (1 - reject)),
                    options[1]: round(100 * reject),
                }
                votes_text = orjson.dumps(votes).decode()
                if "bad-votes" in markers or self.rng.random() < self.config.faults.bad_votes_rate:
                    self.stats["fault_bad_votes"] += 1
                    votes_text = "{" + f"{options[0]}: ten, {options[1]}: lots"
                view = f"{advisor['id']} reads a risk of {reject:.2f}"
                fields = self._fill(advisor.get("schema", {}), "", reject > 0.5, view)
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

    def _plan_step(
        self, token: str, view: dict[str, Any], tools: list[dict[str, Any]], text: str
    ) -> list[dict[str, Any]]:
        """A stateful turn: fetch what the state still lacks (awaited calls and latent
        notes); once everything is known, act with the final tools and await nothing."""
        state = view["state"]

        def known(paths: list[str]) -> bool:
            return any(read_path(state, p) is not None for p in paths)

        calls: list[dict[str, Any]] = []
        awaited = [t for t in tools if t.get("paths") and t.get("kind") != "latent"]
        missing = [t for t in awaited if not known(t["paths"])]
        if missing:
            for tool in missing:
                args = self._fill(tool.get("parameters", {}), "", False, "needed to decide")
                calls.append(
                    {
                        "_tool": tool["name"],
                        "_instance": token,
                        "_reasoningForCall": "the state lacks this",
                        "_outputPath": " || ".join(tool["paths"]),
                        "_scopes": ["input"],
                        **(args if isinstance(args, dict) else {}),
                    }
                )
            for tool in tools:
                if tool.get("kind") != "latent" or (tool.get("paths") and known(tool["paths"])):
                    continue
                args = self._fill(tool.get("parameters", {}), "", False, f"notes: {text[:60]}")
                call = {
                    "_tool": tool["name"],
                    "_instance": token,
                    "_reasoningForCall": "thinking it through",
                    **(args if isinstance(args, dict) else {}),
                }
                if tool.get("paths"):
                    call["_outputPath"] = tool["paths"][0]
                calls.append(call)
            return calls
        urgent = bool(state.get("urgent")) or bool((state.get("customer") or {}).get("vip"))
        for tool in tools:
            if tool.get("kind") == "latent" and not tool.get("paths"):
                # a thought before acting: kept in the trace, never published
                calls.append(
                    {
                        "_tool": tool["name"],
                        "_instance": token,
                        "_reasoningForCall": "weighing the state",
                        **self._fill(tool.get("parameters", {}), "", urgent, "weighing"),
                    }
                )
                continue
            if tool.get("paths") or tool.get("kind") == "latent":
                continue
            args = self._fill(tool.get("parameters", {}), "", urgent, "decided from the state")
            calls.append(
                {
                    "_tool": tool["name"],
                    "_instance": token,
                    "_reasoningForCall": "everything needed is in the state",
                    "_scopes": ["input", "†state"],
                    **(args if isinstance(args, dict) else {}),
                }
            )
        return calls

    def _route_instruction(
        self, req: SimRequest, views: dict[str, dict[str, Any]]
    ) -> list[dict[str, Any]]:
        """A global instruction about one named instance: only that instance acts."""
        text = req.instruction
        quoted = re.findall(r"'([^']+)'|\"([^\"]+)\"", text)
        task = next((a or b for a, b in quoted), text)
        status = "High Priority" if re.search(r"high.priority|urgent", text, re.I) else "Normal"
        tools = [t for t in req.tools if t["name"] not in ("NoAction", "ConsultAdvisor")]
        calls: list[dict[str, Any]] = []
        for token, view in views.items():
            name = str(view["state"].get("name") or view["input"].get("name") or "")
            if name and re.search(rf"\b{re.escape(name)}\b", text):
                tool = tools[0]
                strings = [
                    k
                    for k, v in tool.get("parameters", {}).get("properties", {}).items()
                    if v.get("type") == "string"
                ]
                args = dict(zip(strings, [task, status], strict=False))
                call = {
                    "_tool": tool["name"],
                    "_instance": token,
                    "_reasoningForCall": f"the instruction names {name}",
                    **args,
                }
                if tool.get("paths"):
                    call["_outputPath"] = tool["paths"][0]
                calls.append(call)
            else:
                calls.append(
                    {
                        "_tool": "NoAction",
                        "_instance": token,
                        "_reasoningForCall": "the instruction is about someone else",
                        "reason": "not addressed by the instruction",
                    }
                )
        return calls

    @staticmethod
    def read_request(messages: list[dict[str, str]]) -> SimRequest:
        """Finds tools and advisors (system message), the instances (the user message that
        is a JSON array) and which advisors speak (the user message that is an object)."""
        system = next(m["content"] for m in messages if m["role"] == "system")
        sections = system.split("\n\n")
        tools = orjson.loads(sections[sections.index("# Tools") + 1])
        advisors: list[dict[str, Any]] = []
        instruction = ""
        for k, section in enumerate(sections[:-1]):
            if section.startswith("# Advisors"):
                advisors = orjson.loads(sections[k + 1])
            if section == "# Global inputs":
                for message in orjson.loads(sections[k + 1]):
                    instruction += str(message.get("instruction", ""))
        items: list[dict[str, Any]] = []
        control: dict[str, Any] = {}
        for m in messages:
            if m["role"] != "user":
                continue
            try:
                data = orjson.loads(m["content"])
            except orjson.JSONDecodeError:
                continue  # prose: a re-ask's reasons, which the simulator does not read
            if isinstance(data, list):
                items = [d for d in data if isinstance(d, dict) and "_instance" in d]
            elif isinstance(data, dict):
                control = data
        return SimRequest(
            system,
            tools,
            items,
            advisors,
            tuple(control.get("activeAdvisors", ())),
            bool(control.get("mayConsult", False)),
            instruction,
        )

    def answer(self, req: SimRequest) -> str:
        """The answer text; an item marked poison spoils the whole answer, as a model
        sometimes does when one input derails it."""
        if any("[[sim:poison]]" in orjson.dumps(item).decode() for item in req.items):
            self.stats["fault_poison"] += 1
            return '{"calls": [{"_tool": "oops'
        return orjson.dumps(self.solve(req)).decode()

    # -- HTTP ----------------------------------------------------------------------
    def _over_limit(self, tokens: int) -> web.Response | None:
        """A 429 as an account gives one: too many requests at once, or the tokens of the
        last minute plus this request over the budget (retry-after: when enough frees)."""
        cfg = self.config
        if cfg.max_concurrency and self._active >= cfg.max_concurrency:
            self.stats["refused_concurrency"] += 1
            return _refuse(
                "too many concurrent requests (simulated limit)", cfg.limit_retry_after_s
            )
        if not cfg.tokens_per_minute:
            return None
        now = time.monotonic()
        while self._spent and self._spent[0][0] <= now - 60:
            self._spent.popleft()
        used = sum(n for _, n in self._spent)
        if used + tokens > cfg.tokens_per_minute:
            self.stats["refused_tpm"] += 1
            freed, wait = 0, 60.0
            for at, n in self._spent:
                freed += n
                if used - freed + tokens <= cfg.tokens_per_minute:
                    wait = at + 60 - now
                    break
            return _refuse(
                "tokens per minute exceeded (simulated limit)",
                max(wait, 0.05),
                remaining=max(0, cfg.tokens_per_minute - used),
            )
        self._spent.append((now, tokens))
        return None

    def _account_fault(self, request: web.Request, body: dict[str, Any]) -> str | None:
        """What a real account refuses: a key it does not know, a model it does not serve."""
        key = self.config.api_key
        if key is not None and request.headers.get("Authorization") != f"Bearer {key}":
            return "401"
        if body.get("model") != MODEL_NAME:
            return "404"
        return None

    def _request_fault(self) -> str | None:
        f = self.config.faults
        if f.next:
            return f.next.pop(0)
        draw = self.rng.random()
        for kind, rate in (
            ("429", f.rate_limit_rate),
            ("500", f.error_rate),
            ("hang", f.hang_rate),
            ("malformed", f.malformed_rate),
        ):
            if draw < rate:
                return kind
            draw -= rate
        return None

    async def chat(self, request: web.Request) -> web.Response:
        self.stats["requests"] += 1
        try:
            body = orjson.loads(await request.read())
            messages = body["messages"]
            req = self.read_request(messages)
        except (KeyError, IndexError, StopIteration, orjson.JSONDecodeError, TypeError) as exc:
            self.stats["bad_requests"] += 1
            return web.json_response(
                {
                    "error": {
                        "message": f"simulator cannot read this request: {exc!r}",
                        "type": "invalid_request_error",
                    }
                },
                status=400,
            )
        fault = self._request_fault() or self._account_fault(request, body)
        if fault:
            self.stats[f"fault_{fault}"] += 1
        if fault in _REFUSALS:
            return web.json_response(
                {"error": {"message": _REFUSALS[fault], "type": "invalid_request_error"}},
                status=int(fault),
            )
        if fault == "429":
            return web.json_response(
                {"error": {"message": "rate limited (simulated)", "type": "rate_limit"}},
                status=429,
                headers={"retry-after": str(self.config.faults.retry_after_s)},
            )
        if fault == "500":
            return web.json_response(
                {"error": {"message": "server error (simulated)", "type": "server_error"}},
                status=500,
            )
        if fault == "hang":
            await asyncio.sleep(self.config.faults.hang_s)
        slow = _SLOW.findall(orjson.dumps(req.items).decode())
        if slow:  # a slow batch, while later batches answer at the usual pace
            await asyncio.sleep(max(map(float, slow)))
        content = self.answer(req)
        finish = "stop"
        if fault == "malformed":
            content = content[: len(content) // 2].replace('"', "'", 3) + "}}oops"
        elif fault == "truncated":
            content, finish = content[: len(content) // 2], "length"
        prompt_tokens = sum(estimate_tokens(m["content"]) for m in messages) + 3 * len(messages)
        completion_tokens = estimate_tokens(content)
        refusal = self._over_limit(prompt_tokens + completion_tokens)
        if refusal is not None:
            return refusal
        prefix = hashlib.blake2b(req.system.encode(), digest_size=16).digest()
        cached = estimate_tokens(req.system) if prefix in self._seen_prefixes else 0
        self._seen_prefixes.add(prefix)
        delay = self.config.latency_ms + self.config.per_output_token_ms * completion_tokens
        delay *= 1 + self.config.jitter * (2 * self.rng.random() - 1)
        self._active += 1
        self.stats["max_concurrency_seen"] = max(self.stats["max_concurrency_seen"], self._active)
        try:
            if delay > 0:
                await asyncio.sleep(delay / 1000)
        finally:
            self._active -= 1
        self.stats["completions"] += 1
        self.stats["instances"] += len(req.items)
        self.stats["prompt_tokens"] += prompt_tokens
        self.stats["completion_tokens"] += completion_tokens
        self.stats["cached_tokens"] += cached
        return web.json_response(
            {
                "id": f"simcmpl-{self.stats['requests']}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body.get("model", MODEL_NAME),
                "system_fingerprint": "stream-llm-simulator",
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": finish,
                        "message": {"role": "assistant", "content": content},
                    }
                ],
                "usage": {
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": completion_tokens,
                    "total_tokens": prompt_tokens + completion_tokens,
                    "prompt_tokens_details": {"cached_tokens": cached},
                },
            },
            dumps=lambda o: orjson.dumps(o).decode(),
        )

    async def models(self, _: web.Request) -> web.Response:
        return web.json_response(
            {
                "object": "list",
                "data": [
                    {
                        "id": MODEL_NAME,
                        "object": "model",
                        "created": 0,
                        "owned_by": "stream LLM simulator (not a real model)",
                    }
                ],
            }
        )

    async def get_stats(self, _: web.Request) -> web.Response:
        return web.json_response(dict(self.stats))

    async def set_faults(self, request: web.Request) -> web.Response:
        update = await request.json()
        merged = {**self.config.faults.model_dump(), **update}
        self.config = self.config.model_copy(update={"faults": Faults.model_validate(merged)})
        return web.json_response(self.config.faults.model_dump())

    async def set_config(self, request: web.Request) -> web.Response:
        update = await request.json()
        self.config = SimConfig.model_validate({**self.config.model_dump(), **update})
        return web.json_response(self.config.model_dump())

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_get("/sim/stats", self.get_stats)
        app.router.add_post("/sim/faults", self.set_faults)
        app.router.add_post("/sim/config", self.set_config)
        return app


def _refuse(message: str, retry_after: float, remaining: int | None = None) -> web.Response:
    headers = {"retry-after": f"{retry_after:.2f}"}
    if remaining is not None:
        headers["x-ratelimit-remaining-tokens"] = str(remaining)
    return web.json_response(
        {"error": {"message": message, "type": "rate_limit"}}, status=429, headers=headers
    )


async def serve(sim: Simulator, host: str, port: int) -> tuple[web.AppRunner, int]:
    # Cancel a handler when its client gives up (a "hang" fault must not outlive it).
    runner = web.AppRunner(
        sim.app(), access_log=None, handler_cancellation=True, shutdown_timeout=2.0
    )
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    server: Any = site._server
    bound = server.sockets[0].getsockname()[1] if server is not None else port
    return runner, int(bound)


@contextmanager
def running_simulator(
    config: SimConfig | None = None, host: str = "127.0.0.1", port: int = 0
) -> Iterator[tuple[Simulator, str]]:
    """Runs the simulator on its own event-loop thread; yields it and its /v1 base URL."""
    sim = Simulator(config)
    sim._toxicity(["warm up"])  # load the classifier before the first timed request
    loop = asyncio.new_event_loop()
    ready: dict[str, Any] = {}
    started = threading.Event()

    def run() -> None:
        asyncio.set_event_loop(loop)
        ready["runner"], ready["port"] = loop.run_until_complete(serve(sim, host, port))
        started.set()
        loop.run_forever()

    thread = threading.Thread(target=run, name="llm-simulator", daemon=True)
    thread.start()
    started.wait(30)
    try:
        yield sim, f"http://{host}:{ready['port']}/v1"
    finally:
        asyncio.run_coroutine_threadsafe(ready["runner"].cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
