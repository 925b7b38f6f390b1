"""The providers' cache rules: which prompt tokens each caches and what the bill is."""

from __future__ import annotations

import pytest
from instanced_stream.core.cache_rule import PRESETS, CacheRule, CacheUse, preset_rule
from instanced_stream.core.spec import ModelEndpoint
from pydantic import ValidationError

_OPENAI = preset_rule("openai-0.1x")
_ANTHROPIC = preset_rule("anthropic")


@pytest.mark.parametrize(
    ("prefix", "cached"),
    [(706, 0), (1023, 0), (1024, 1024), (1151, 1024), (1152, 1152), (1319, 1280)],
)
def test_openai_caches_from_1024_tokens_in_128_token_steps(prefix: int, cached: int) -> None:
    assert _OPENAI.cacheable(prefix) == cached
    assert _OPENAI.use(prefix, seen=True) == CacheUse(read=cached)


def test_an_automatic_cache_stores_the_first_request_at_no_premium() -> None:
    assert _OPENAI.use(2000, seen=False) == CacheUse()


def test_a_breakpoint_cache_bills_its_first_write_and_reads_after() -> None:
    assert _ANTHROPIC.use(1100, seen=False) == CacheUse(written=1100)
    assert _ANTHROPIC.use(1100, seen=True) == CacheUse(read=1100)
    # Below the minimum nothing is cached at all, however often it repeats.
    assert _ANTHROPIC.use(900, seen=True) == CacheUse()
    assert _ANTHROPIC.over(1100, 10) == CacheUse(read=9 * 1100, written=1100)
    assert _ANTHROPIC.over(1100, 0) == CacheUse()


def test_without_a_minimum_any_repeat_is_cached_whole() -> None:
    rule = preset_rule("any-repeat-0.5x")
    assert rule.use(706, seen=True) == CacheUse(read=706)


_PRICES = ModelEndpoint(price_input_per_million=1.0, price_output_per_million=4.0)


@pytest.mark.parametrize(
    ("preset", "expected"),
    [
        # 10,000 prompt tokens of which 8,000 read from the cache, 1,000 completion
        ("openai-0.5x", 2000 * 1.0 + 8000 * 0.5 + 1000 * 4.0),
        ("openai-0.25x", 2000 * 1.0 + 8000 * 0.25 + 1000 * 4.0),
        ("openai-0.1x", 2000 * 1.0 + 8000 * 0.1 + 1000 * 4.0),
        ("no-cache", 10000 * 1.0 + 1000 * 4.0),
    ],
)
def test_cached_tokens_cost_the_rules_share_of_the_input_price(
    preset: str, expected: float
) -> None:
    cost = _PRICES.cost_usd(10_000, 1000, 8000, rule=PRESETS[preset].rule)
    assert cost == pytest.approx(expected / 1e6)


def test_tokens_written_to_a_breakpoint_cost_the_write_premium() -> None:
    # 10,000 prompt tokens: 1,000 written (1.25x), 8,000 read (0.1x), 1,000 plain
    cost = _PRICES.cost_usd(10_000, 0, 8000, written=1000, rule=_ANTHROPIC)
    assert cost == pytest.approx((1000 * 1.0 + 1000 * 1.25 + 8000 * 0.1) / 1e6)
    # written and read never pass the prompt's tokens
    assert _PRICES.cost_usd(100, 0, 80, written=500, rule=_ANTHROPIC) == pytest.approx(
        (80 * 0.1 + 20 * 1.25) / 1e6
    )


def test_batch_lines_cost_half_under_every_rule() -> None:
    for preset in PRESETS.values():
        online = _PRICES.cost_usd(10_000, 1000, 8000, written=500, rule=preset.rule)
        batch = _PRICES.cost_usd(10_000, 1000, 8000, written=500, batch=True, rule=preset.rule)
        assert batch == pytest.approx(online / 2)


def test_a_spec_names_a_preset_or_writes_its_own_rule() -> None:
    named = ModelEndpoint(price_input_per_million=1.0, cache="openai-0.1x")
    assert named.cache_rule == _OPENAI
    # the spec's own rule bills when no other is asked for
    assert named.cost_usd(2000, 0, 1024) == pytest.approx((976 + 102.4) / 1e6)
    own = ModelEndpoint.model_validate(
        {"price_input_per_million": 1.0, "cache": {"read_factor": 0.2, "min_tokens": 2048}}
    )
    assert own.cache_rule == CacheRule(read_factor=0.2, min_tokens=2048)
    with pytest.raises(ValidationError):
        ModelEndpoint.model_validate({"cache": "openai-0.01x"})


def test_a_cached_price_and_a_read_factor_together_are_refused() -> None:
    with pytest.raises(ValidationError, match="set one"):
        ModelEndpoint(price_cached_input_per_million=0.05, cache="openai-0.1x")
    # the cached price alone keeps its old meaning
    alone = ModelEndpoint(price_input_per_million=1.0, price_cached_input_per_million=0.3)
    assert alone.cost_usd(1000, 0, 1000) == pytest.approx(1000 * 0.3 / 1e6)


def test_every_preset_names_the_date_it_was_read() -> None:
    for name, preset in PRESETS.items():
        assert preset.name == name
        assert len(preset.read_on) == 10 and preset.read_on.startswith("20")
        assert preset.about
    with pytest.raises(ValueError, match="openai-0\\.1x"):
        preset_rule("gemini")
