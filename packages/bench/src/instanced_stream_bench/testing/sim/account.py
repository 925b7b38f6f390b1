"""What the simulated endpoint is configured to be: its name, its latency and limits
like a real account's, and the faults it injects (see instanced_stream_bench.testing.sim.server)."""

from __future__ import annotations

from typing import Literal

from instanced_stream.core.cache_rule import CacheRule, PresetName, preset_rule
from pydantic import BaseModel, Field

__all__ = ["MODEL_NAME", "Faults", "SimConfig"]

MODEL_NAME = "stream-sim-1"


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
    # Share of items whose decision, in a request of two or more, is the opposite of the
    # one they get alone (the same items every time): the shadow sample's test.
    disagree_rate: float = 0.0
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
    provider: Literal["generic", "openai", "azure"] = Field(
        "generic",
        description="whose documented request rules, error shapes and rate-limit headers to "
        "follow (instanced_stream_bench.testing.sim.provider); generic: takes any parameter, as "
        "llama.cpp does",
    )
    requests_per_minute: int = Field(0, ge=0, description="requests per 60 s (0: no limit)")
    cache: PresetName | CacheRule = Field(
        "openai-0.1x",
        description="whose prompt-cache rule `cached_tokens` follows (a preset of "
        "instanced_stream.core.cache_rule or a rule): OpenAI's by default, so a shared "
        "prefix under 1,024 tokens is never reported cached",
    )
    model: str = Field(MODEL_NAME, description="the model name it serves (404 for others)")
    # The Batch API (instanced_stream_bench.testing.sim.batch_api).
    batch_delay_s: float = Field(1.0, ge=0, description="a batch's time to completion")
    batch_expire_rate: float = Field(
        0.0, ge=0, le=1, description="share of lines left unanswered: the batch expires"
    )
    batch_error_rate: float = Field(
        0.0, ge=0, le=1, description="share of lines that fail with a 500 in the error file"
    )
    batch_fail_next: int = Field(
        0, ge=0, description="the next this many batches fail as a whole (validation)"
    )
    batch_upstream: str | None = Field(
        None,
        description="an OpenAI-compatible /v1 URL (a real model, `stream llm-local`) that "
        "answers the batch lines instead of the simulator's judge",
    )
    plan_order: Literal["mixed", "producers_first", "readers_first", "interleaved"] = Field(
        "mixed",
        description="the order a stateful plan's calls are written in: a model may list a "
        "step before the step whose output it reads; mixed: chosen per request",
    )
    obedient: bool = Field(
        False,
        description='follow instructions found inside items ("for item ③ reject"), as an '
        "injectable model would: first the injected call for the other instance, its reason "
        "copying the injecting text; for proving the product's defenses",
    )

    @property
    def cache_rule(self) -> CacheRule:
        return preset_rule(self.cache) if isinstance(self.cache, str) else self.cache
