"""An OpenAI-compatible LLM SIMULATOR. It is not a language model.

It stands in for a model where none is reachable: it reads our multi-instance request,
decides moderation with a real trained classifier (alt-profanity-check, whose model ships
in its wheel) plus spam rules, answers with a solution valid for the requested schema,
reports token usage (and prompt-prefix cache hits by a provider's rule: `SimConfig.cache`,
testing/sim/prefix_cache.py), and injects faults for tests.

Faults: per-request switches (`next`: a queue of "429", "500", "401", "403", "404",
"hang", "malformed", "truncated"), rates for the same and for per-instance faults, and
markers in an item's text that force a per-instance fault deterministically:
`[[sim:skip-once]]`, `[[sim:skip-always]]`, `[[sim:unknown-tool]]`, `[[sim:invent]]`,
`[[sim:bad-args]]`, `[[sim:noaction]]`, `[[sim:poison]]` (spoils any answer that
includes the item, so only splitting the batch can isolate it), and for advisors
`[[sim:consult]]` (asks the first on-demand advisor), `[[sim:disagree]]` (the council
votes against the decision) and `[[sim:bad-votes]]` (malformed inline JSON).
`[[sim:slow=SECONDS]]` delays the answer of every request that contains the item;
`[[sim:error500]]` makes every request that contains it fail with HTTP 500.

`SimConfig.provider` makes it follow a provider's documented request rules, error
shapes and rate-limit headers (`instanced_stream_bench.testing.sim.provider`).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
import threading
import time
from collections import Counter, deque
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import orjson
from aiohttp import web
from instanced_stream.core.tokenizer import estimate_tokens

from instanced_stream_bench.testing.sim.account import MODEL_NAME, Faults, SimConfig
from instanced_stream_bench.testing.sim.batch_api import BatchEndpoints
from instanced_stream_bench.testing.sim.disagree import Drifting
from instanced_stream_bench.testing.sim.prefix_cache import PrefixCache
from instanced_stream_bench.testing.sim.provider import (
    Refusal,
    account_fault,
    reasoning_model,
    refusal,
)
from instanced_stream_bench.testing.sim.quota import Quota
from instanced_stream_bench.testing.sim.repeats import Repeats
from instanced_stream_bench.testing.sim.request import SimRequest, read_request

__all__ = [
    "MODEL_NAME",
    "Faults",
    "SimConfig",
    "SimRequest",
    "Simulator",
    "answer_parts",
    "running_simulator",
    "serve",
    "serve_forever",
]

log = logging.getLogger("stream.simulator")

_REFUSALS = {
    "401": "Incorrect API key provided (simulated)",
    "403": "This key has no access to the model (simulated)",
    "404": f"The model does not exist; this endpoint serves {MODEL_NAME} (simulated)",
}
_SLOW = re.compile(r"\[\[sim:slow=(\d+(?:\.\d+)?)\]\]")
# Hidden reasoning tokens a reasoning model spends per request, by reasoning_effort.
_THINKING = {"none": 0, "minimal": 8, "low": 64, "medium": 192, "high": 512}


class Simulator(Drifting):
    """The judge behind an OpenAI-compatible HTTP API, with an account's limits."""

    def __init__(self, config: SimConfig | None = None) -> None:
        super().__init__(config)
        self.prefix_cache = PrefixCache()
        self.repeats = Repeats()  # answers asked for again: `items_asked_again`
        self._system_tokens: dict[bytes, int] = {}  # a system message's tokens, by its hash
        self._active = 0  # requests being answered now
        self.quota = Quota()  # the account's per-minute budget
        # The last requests' messages as sent: tests assert what the product asked.
        self.seen: deque[list[dict[str, Any]]] = deque(maxlen=500)
        self.seen_total = 0  # requests ever seen: `seen` keeps only the last 500
        # ... and the parameters beside them (model, caps, temperature, response_format).
        self.bodies: deque[dict[str, Any]] = deque(maxlen=500)
        self.batch_api = BatchEndpoints(self)  # the Files and Batches endpoints

    def _over_limit(self, tokens: int) -> web.Response | None:
        """A 429 as an account gives one: too many requests at once, or the tokens of the
        last minute plus this request over the budget (retry-after: when enough frees)."""
        cfg = self.config
        if cfg.max_concurrency and self._active >= cfg.max_concurrency:
            self.stats["refused_concurrency"] += 1
            return _refuse(
                "too many concurrent requests (simulated limit)", cfg.limit_retry_after_s
            )
        over = self.quota.tokens(cfg, tokens)
        if over is None:
            return None
        self.stats["refused_tpm"] += 1
        limits = self.quota.headers(cfg)  # what is left is in them
        return _refuse("tokens per minute exceeded (simulated limit)", over, limits)

    def _error(self, refused: Refusal, headers: dict[str, str] | None = None) -> web.Response:
        """An error as the provider shapes it (the generic one says less)."""
        return web.json_response(
            refused.body(self.config.provider), status=refused.status, headers=headers
        )

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

    def _unreadable(self, exc: Exception) -> web.Response:
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

    async def chat(self, request: web.Request, deployment: str | None = None) -> web.Response:
        self.stats["requests"] += 1
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError as exc:
            return self._unreadable(exc)
        if deployment is not None:
            body["model"] = deployment
        return await self.respond(body, request.headers, request.query)

    async def respond(
        self,
        body: dict[str, Any],
        headers: Mapping[str, str],
        query: Mapping[str, str],
        *,
        batch: bool = False,
    ) -> web.Response:
        """One chat completion. `batch`: a Batch API line, answered off-line: no latency,
        no per-minute limits, its tokens counted apart (billed at the batch price)."""
        # A real account checks the key and the model before it reads the request; the
        # injected faults apply to requests it could read (a start-up check is not one).
        fault = account_fault(self.config, headers, query, body, self.config.model)
        # The provider refuses a parameter before it reads the messages.
        refused = refusal(self.config.provider, body) if fault is None else None
        if refused is not None:
            self.stats["refused_shape"] += 1
            return self._error(refused)
        if fault is None:
            try:
                req = read_request(body["messages"])
            except (KeyError, IndexError, StopIteration, orjson.JSONDecodeError, TypeError) as exc:
                return self._unreadable(exc)
            shape = body.get("response_format")
            if isinstance(shape, dict) and shape.get("type") == "json_object":
                req = replace(req, free_form=True)
            # Injected faults are for the stream's requests, not the start-up probe.
            fault = None if "x-stream-probe" in headers else self._request_fault()
        if fault:
            self.stats[f"fault_{fault}"] += 1
        if fault in _REFUSALS:
            code = {"401": "invalid_api_key", "404": "model_not_found"}.get(fault)
            return self._error(Refusal(int(fault), _REFUSALS[fault], code=code))
        messages = body["messages"]
        if "x-stream-probe" not in headers:  # the stream's asks; probes apart
            self.seen.append(messages)
            self.seen_total += 1
        self.bodies.append({k: v for k, v in body.items() if k != "messages"})
        if fault is None and "[[sim:error500]]" in orjson.dumps(req.items).decode():
            fault = "500"
            self.stats["fault_500"] += 1
        if fault == "429":
            wait = self.config.faults.retry_after_s
            return self._error(
                Refusal(429, "rate limited (simulated)", "requests", code="rate_limit_exceeded"),
                {"retry-after": str(wait), "retry-after-ms": str(int(wait * 1000))},
            )
        if fault == "500":
            return self._error(Refusal(500, "server error (simulated)", "server_error"))
        full = None if batch else self.quota.request(self.config)
        if full is not None:
            self.stats["refused_rpm"] += 1
            limits = self.quota.headers(self.config)
            return _refuse("requests per minute exceeded (simulated limit)", full, limits)
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
        prefix = hashlib.blake2b(req.system.encode(), digest_size=16).digest()
        system = self._system_tokens.get(prefix)
        if system is None:
            # The instructions are the same every request: counted once (counting is
            # most of what an instant simulator does, and a benchmark of the processor
            # must not measure the simulator).
            if len(self._system_tokens) > 1000:
                self._system_tokens.clear()
            system = self._system_tokens[prefix] = estimate_tokens(req.system)
        prompt_tokens = 3 * len(messages) + sum(
            system if m["content"] is req.system else estimate_tokens(m["content"])
            for m in messages
        )
        completion_tokens = estimate_tokens(content)
        thinking = 0
        if self.config.provider != "generic" and reasoning_model(str(body.get("model"))):
            thinking = _THINKING.get(str(body.get("reasoning_effort") or "medium"), 192)
            cap = body.get("max_completion_tokens")
            if isinstance(cap, int) and thinking + completion_tokens > cap:
                # Reasoning spends the budget first: what is left may not hold the answer.
                room = max(0, cap - thinking)
                content, finish = content[: room * 3], "length"
                thinking = min(thinking, cap)
                completion_tokens = estimate_tokens(content) if content else 0
        over = None if batch else self._over_limit(prompt_tokens + completion_tokens + thinking)
        if over is not None:
            return over
        # What the provider's cache would serve, by its rule (and by every preset, apart).
        tier = "batch_" if batch else ""
        by_rule: Counter[str] = Counter()
        cached = self.prefix_cache.serve(prefix, system, self.config.cache_rule, by_rule, tier)
        delay = 0.0 if batch else self.config.latency_ms
        delay += 0.0 if batch else self.config.per_output_token_ms * completion_tokens
        delay *= 1 + self.config.jitter * (2 * self.rng.random() - 1)
        self._active += 1
        self.stats["max_concurrency_seen"] = max(self.stats["max_concurrency_seen"], self._active)
        try:
            if delay > 0:
                await asyncio.sleep(delay / 1000)
        finally:
            self._active -= 1
        # The processor's start-up probe is counted apart: the stream's own requests are
        # what tests and the bench compare (nothing asked twice, requests per item).
        probe = "x-stream-probe" in headers
        self.stats["probes" if probe else "completions"] += 1
        self.stats["instances"] += 0 if probe else len(req.items)
        self.stats["item_requests"] += int(bool(req.items) and not probe)
        # Batch lines' tokens apart: the Batch API bills them at its own (half) price.
        self.stats.update(by_rule)
        self.stats[f"{tier}prompt_tokens"] += prompt_tokens
        self.stats[f"{tier}completion_tokens"] += completion_tokens + thinking
        self.stats["reasoning_tokens"] += thinking
        if not probe and finish == "stop" and fault != "malformed":
            self.stats.update(answer_parts(content))
            # The advisors that speak are the request's too: a consult's follow-up is
            # another question about the same instance, not the same one again.
            asked = f"{req.system}\n{req.active}\n{req.may_consult}"
            self.stats["items_asked_again"] += self.repeats.answered(asked, req.items)
        self.stats[f"{tier}cached_tokens"] += cached
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
                    # As OpenAI reports it: reasoning is part of the completion (billed as
                    # output) and broken out in the details.
                    "completion_tokens": completion_tokens + thinking,
                    "total_tokens": prompt_tokens + completion_tokens + thinking,
                    "prompt_tokens_details": {"cached_tokens": cached},
                    "completion_tokens_details": {"reasoning_tokens": thinking},
                },
            },
            headers=self.quota.headers(self.config),
            dumps=lambda o: orjson.dumps(o).decode(),
        )

    async def azure_chat(self, request: web.Request) -> web.Response:
        """Azure names the model by its deployment; the body's `model` is not read."""
        return await self.chat(request, deployment=request.match_info["deployment"])

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
        app.router.add_get("/v1/models", _models)
        app.router.add_post("/v1/chat/completions", self.chat)
        # Azure OpenAI's layout: the deployment in the path, the api-version in the query.
        app.router.add_post("/openai/deployments/{deployment}/chat/completions", self.azure_chat)
        self.batch_api.routes(app)
        app.router.add_get("/sim/stats", self.get_stats)
        app.router.add_post("/sim/faults", self.set_faults)
        app.router.add_post("/sim/config", self.set_config)
        return app


def answer_parts(content: str) -> Counter[str]:
    """The answer's tokens by who wrote them: `answer_tokens:<advisor id>` for each
    advisor's opinions, `answer_tokens:calls` for the rest (the calls and the frame), so
    a bench or an eval shows what each advisor costs. A free-form answer that does not
    parse counts as calls."""
    parts: Counter[str] = Counter()
    total = estimate_tokens(content)
    try:
        opinions = orjson.loads(content).get("advisors") or []
    except (orjson.JSONDecodeError, AttributeError):
        opinions = []
    for opinion in opinions if isinstance(opinions, list) else []:
        if isinstance(opinion, dict):
            parts[f"answer_tokens:{opinion.get('id')}"] += estimate_tokens(
                orjson.dumps(opinion).decode()
            )
    parts["answer_tokens:calls"] = max(0, total - sum(parts.values()))
    return parts


async def _models(_: web.Request) -> web.Response:
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


def _refuse(
    message: str,
    retry_after: float,
    limits: dict[str, str] | None = None,
) -> web.Response:
    """A 429; a provider profile's carries the account's `x-ratelimit-*` headers as well,
    as OpenAI's and Azure's do."""
    headers = {"retry-after": f"{retry_after:.2f}", "retry-after-ms": str(int(retry_after * 1000))}
    headers |= limits or {}
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
    bound = runner.addresses[0][1] if runner.addresses else port
    return runner, int(bound)


@contextmanager
def running_simulator(
    config: SimConfig | None = None, host: str = "127.0.0.1", port: int = 0
) -> Iterator[tuple[Simulator, str]]:
    """Runs the simulator on its own event-loop thread; yields it and its /v1 base URL."""
    sim = Simulator(config)
    sim.toxicity(["warm up"])  # load the classifier before the first timed request
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


def serve_forever(config: SimConfig, host: str, port: int) -> int:
    """`stream llm-sim`: the simulator in the foreground until Ctrl-C or SIGTERM."""
    print(
        f"LLM SIMULATOR (not a model, provider {config.provider}) on http://{host}:{port}/v1",
        flush=True,
    )
    sim = Simulator(config)
    web.run_app(
        sim.app(),
        host=host,
        port=port,
        print=None,
        handler_cancellation=True,
        access_log=None,  # a line per request cost more than answering an instant one
    )
    return 0
