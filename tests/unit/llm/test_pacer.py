"""The pacer reads the provider's rate-limit headers as OpenAI documents them."""

from __future__ import annotations

import time

import pytest
from instanced_stream.llm.pacer import Pacer, reset_seconds


def test_reset_durations_read_in_openais_form() -> None:
    assert reset_seconds("6m0s") == 360
    assert reset_seconds("1s") == 1
    assert reset_seconds("20ms") == pytest.approx(0.02)
    assert reset_seconds("1m30.5s") == pytest.approx(90.5)
    assert reset_seconds("0.25") == 0.25
    assert reset_seconds(None) is None


def test_limits_size_the_buckets_and_an_empty_budget_holds_until_its_reset() -> None:
    pacer = Pacer()
    pacer.observe({"x-ratelimit-limit-requests": "500", "x-ratelimit-limit-tokens": "30000"})
    assert pacer.requests is not None and pacer.requests.max_rate == 500
    assert pacer.tokens is not None and pacer.tokens.max_rate == 30000
    assert pacer.hold_until == 0
    pacer.observe({"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "2s"})
    assert pacer.hold_until == pytest.approx(time.monotonic() + 2, abs=0.5)


async def test_an_endpoint_without_headers_is_not_paced() -> None:
    pacer = Pacer()
    started = time.monotonic()
    for _ in range(100):
        await pacer.wait(10_000)
    assert time.monotonic() - started < 0.5 and pacer.requests is None
