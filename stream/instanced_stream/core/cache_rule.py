"""How a provider bills its prompt-prefix cache, and the rules it bills by today.

A cache rule says which prompt tokens a request gets from the provider's cache and at
what share of the input price: OpenAI caches the longest prefix it has seen before, only
from 1,024 tokens on and in 128-token steps; Anthropic caches only up to a breakpoint the
request marks, reads it at a tenth of the input price and bills its first write at a
premium. Below a rule's minimum a shared prefix is billed as plain input, however often
it repeats: the per-item baseline is then not cheaper for its repetition.

The presets are the rules as read on their date; prices change, so each names its date
and the spec may set any rule of its own (`model.cache`, docs/performance.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["PRESETS", "CacheRule", "CacheUse", "Preset", "PresetName", "preset_rule"]


class CacheRule(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    read_factor: float | None = Field(
        None,
        ge=0,
        le=1,
        description="A cached prompt token's price as a share of the input price (0.1: a "
        "tenth); unset: model.price_cached_input_per_million, else the input price",
    )
    min_tokens: int = Field(
        0, ge=0, description="A shared prefix shorter than this is never cached (OpenAI: 1024)"
    )
    step_tokens: int = Field(
        1, ge=1, description="Cached tokens come in steps of this above the minimum (OpenAI: 128)"
    )
    breakpoints: bool = Field(
        False,
        description="Only the prefix the request marks is cached (Anthropic's cache_control): "
        "its first request writes it at write_factor, later ones read it",
    )
    write_factor: float = Field(
        1.0, ge=1, description="A cache write's price as a share of the input price (1.25)"
    )

    def cacheable(self, prefix: int) -> int:
        """Of a shared prefix of `prefix` tokens, how many the provider would cache."""
        if prefix < max(self.min_tokens, 1):
            return 0
        return self.min_tokens + (prefix - self.min_tokens) // self.step_tokens * self.step_tokens

    def use(self, prefix: int, seen: bool) -> CacheUse:
        """What one request of shared prefix `prefix` reads from the cache and writes to
        it; `seen`: the same prefix was sent before (and has not expired)."""
        kept = self.cacheable(prefix)
        if seen:
            return CacheUse(read=kept)
        # Automatic caches store on the first request at no charge; a breakpoint's write
        # is billed at its premium.
        return CacheUse(written=kept if self.breakpoints else 0)

    def over(self, prefix: int, requests: int) -> CacheUse:
        """A run of `requests` requests sharing one prefix: the first writes it, the rest
        read it (the bench's runs last minutes, within every cache's lifetime)."""
        if requests <= 0:
            return CacheUse()
        first, later = self.use(prefix, False), self.use(prefix, True)
        return CacheUse(read=later.read * (requests - 1), written=first.written)


@dataclass(frozen=True, slots=True)
class CacheUse:
    """Prompt tokens read from the cache and written to it (a part of the prompt each)."""

    read: int = 0
    written: int = 0


PresetName = Literal[
    "any-repeat-0.5x", "openai-0.5x", "openai-0.25x", "openai-0.1x", "anthropic", "no-cache"
]


@dataclass(frozen=True, slots=True)
class Preset:
    name: PresetName
    rule: CacheRule
    read_on: str  # the date the rule was read (ISO)
    about: str


_OPENAI = {"min_tokens": 1024, "step_tokens": 128}
# Read 2026-12-01, as DESIGN.md section 5 states them for late 2026 and OpenAI's and
# Anthropic's caching guides describe them. Batch APIs bill 0.5x of each price on top
# (model.price_batch_factor), whatever the cache rule.
PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset(
            "any-repeat-0.5x",
            CacheRule(read_factor=0.5),
            "2026-12-01",
            "any repeated prefix at half price, whatever its length: no provider bills by "
            "it; the bench's figures before the providers' rules",
        ),
        Preset(
            "openai-0.5x",
            CacheRule(read_factor=0.5, **_OPENAI),
            "2026-12-01",
            "OpenAI's older models (GPT-4o family): 0.5x, from 1,024 tokens in 128-token steps",
        ),
        Preset(
            "openai-0.25x",
            CacheRule(read_factor=0.25, **_OPENAI),
            "2026-12-01",
            "OpenAI's GPT-4.1 family: 0.25x, from 1,024 tokens in 128-token steps",
        ),
        Preset(
            "openai-0.1x",
            CacheRule(read_factor=0.1, **_OPENAI),
            "2026-12-01",
            "OpenAI's newest models (GPT-5 family): 0.1x, from 1,024 tokens in 128-token steps",
        ),
        Preset(
            "anthropic",
            CacheRule(read_factor=0.1, min_tokens=1024, breakpoints=True, write_factor=1.25),
            "2026-12-01",
            "Anthropic (Sonnet, Opus): a breakpoint after the shared part, reads 0.1x, a "
            "5-minute write 1.25x, from 1,024 tokens (Haiku: 2,048)",
        ),
        Preset("no-cache", CacheRule(read_factor=1.0), "2026-12-01", "no prefix cache at all"),
    )
}


def preset_rule(name: str) -> CacheRule:
    """The rule of a preset; an unknown name is a ValueError naming the presets."""
    preset = PRESETS.get(name)
    if preset is None:
        raise ValueError(f"unknown cache preset {name!r}: one of {', '.join(PRESETS)}")
    return preset.rule
