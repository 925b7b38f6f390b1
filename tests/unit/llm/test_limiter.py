"""Adaptive concurrency (AIMD) and token-aware windows, without a network."""

from __future__ import annotations

import asyncio
import time

import pytest
from instanced_stream.core.tokenizer import Tokenizer, estimate_tokens
from instanced_stream.llm.limiter import Limiter
from instanced_stream.runtime.pipeline.windows.windowing import Windower


async def test_limit_grows_one_slot_per_round_trip_while_healthy() -> None:
    limiter = Limiter(16, initial=2)
    for _ in range(3):  # about one round trip at limit 2 (each answer adds 1/limit)
        limiter.on_success(0.1)
    assert limiter.slots == 3
    for _ in range(200):
        limiter.on_success(0.1)
    assert limiter.slots == 16  # never past the ceiling


async def test_refusal_cuts_below_the_refused_level_and_probes_slowly_after() -> None:
    limiter = Limiter(32, initial=10)
    for _ in range(10):
        await limiter.acquire()
    limiter.on_overload(None)  # the tenth was refused: nine were borne
    assert limiter.slots == 9
    limiter.on_overload(None)  # same burst: not a second cut
    assert limiter.slots == 9
    for _ in range(9):
        limiter.release()
    before = limiter.limit
    for _ in range(10):  # the next slot would reach the refused level: probe it slowly
        limiter.on_success(0.1)
    assert 0 < limiter.limit - before < 0.2
    limiter.release()
    limiter._plateau = 20.0  # long ago the endpoint refused far higher up
    for _ in range(10):  # well below the refused level the limit grows at full speed
        limiter.on_success(0.1)
    assert limiter.slots == 10


async def test_retry_after_pauses_new_requests() -> None:
    limiter = Limiter(4, initial=4)
    await limiter.acquire()
    limiter.on_overload(0.3)
    limiter.release()
    started = time.monotonic()
    await limiter.acquire()
    assert time.monotonic() - started >= 0.25


async def test_doubled_latency_cuts_the_limit_but_bigger_answers_do_not() -> None:
    limiter = Limiter(16, initial=16)
    for _ in range(10):
        limiter.on_success(0.1, completion_tokens=100)
    for _ in range(10):  # ten times the tokens, eight times the time: a bigger window
        limiter.on_success(0.8, completion_tokens=1000)
    assert limiter.slots == 16 and limiter.cuts == 0
    for _ in range(5):  # the small answers now take six times as long: congestion
        limiter.on_success(0.6, completion_tokens=100)
    assert limiter.slots < 16
    assert limiter.cuts >= 1


async def test_fixed_limit_when_not_adaptive() -> None:
    limiter = Limiter(3, adaptive=False)
    assert limiter.slots == 3
    for _ in range(3):
        await limiter.acquire()
    limiter.on_overload(None)
    assert limiter.slots == 3
    waiter = asyncio.create_task(limiter.acquire())
    await asyncio.sleep(0.05)
    assert not waiter.done()  # all three slots busy
    limiter.release()
    await asyncio.wait_for(waiter, 1)


def test_tiktoken_counts_exactly_for_known_models_and_approximates_others() -> None:
    exact = Tokenizer("gpt-4")
    assert exact.exact and exact.method == "tiktoken cl100k_base"
    assert exact.count("hello world") == 2
    other = Tokenizer("stream-sim-1")
    assert not other.exact and "approximation" in other.method
    # Non-English text costs far more tokens per byte than the 4-bytes rule assumes.
    text = "数据流处理" * 40
    assert other.count(text) > estimate_tokens(len(text.encode())) / 2
    assert estimate_tokens("hello world", "gpt-4") == 2


async def test_window_closes_when_the_expected_answer_would_outgrow_the_budget() -> None:
    closed: list[tuple[list[int], str]] = []

    async def on_close(items: list[int], reason: str) -> None:
        closed.append((items, reason))

    capacity = 3

    class Size:
        item_tokens = 1000

        def limit(self) -> tuple[int, str]:
            return (capacity, "output") if capacity < 10 else (10, "items")

    win: Windower[int] = Windower(
        size=Size(), max_wait_s=60, on_close=on_close, tokens_of=lambda i: 100
    )
    for i in range(4):
        await win.add(i)
    assert closed == [([0, 1, 2], "output")]
    capacity = 100
    for i in range(4, 20):
        await win.add(i)
    # prompt budget: ten items of 100 tokens fill 1000, the eleventh opens a new window
    assert [reason for _, reason in closed] == ["output", "items"]
    assert len(win) == 7


@pytest.mark.parametrize("ceiling", [1, 2])
async def test_small_ceilings_start_at_one_or_more(ceiling: int) -> None:
    assert Limiter(ceiling).slots >= 1


def test_timeouts_halve_the_window_and_answers_in_time_grow_it_back() -> None:
    limiter = Limiter(4)
    assert limiter.max_items is None
    limiter.on_timeout(25)
    assert limiter.max_items == 12
    limiter.on_timeout(20)  # a request sent before the cut: the smaller cap stays
    assert limiter.max_items == 10
    limiter.on_success(9.0, 100, items=10, share_of_timeout=0.9)  # in time, but barely
    assert limiter.max_items == 10
    limiter.on_success(2.0, 100, items=10, share_of_timeout=0.2)
    assert limiter.max_items == 11
    limiter.on_success(1.0, 100, items=5, share_of_timeout=0.1)  # smaller than the cap
    assert limiter.max_items == 11


def test_windows_shrink_to_what_the_endpoint_answered_in_time() -> None:
    from instanced_stream.core.spec import load_spec
    from instanced_stream.runtime.pipeline.windows.window_size import WindowSize
    from instanced_stream.settings import DEFAULT_SPEC

    spec = load_spec(DEFAULT_SPEC)
    limiter = Limiter(4)
    size = WindowSize(spec, Tokenizer(spec.model.name), "instructions", limiter)
    assert size.capacity() == spec.window.max_items == 25
    assert size.limit() == (25, "items")
    limiter.on_timeout(25)
    assert size.capacity() == 12
    assert size.limit() == (12, "output")


def test_the_window_size_is_the_smallest_of_its_four_authors() -> None:
    """Spec, quality controller, limiter and output budget each bound the window; the one
    object every reader asks answers the smallest, and names which kind it was."""
    from instanced_stream.core.spec import load_spec
    from instanced_stream.runtime.pipeline.windows.window_size import WindowSize
    from instanced_stream.settings import DEFAULT_SPEC

    spec = load_spec(DEFAULT_SPEC)
    limiter = Limiter(4)
    size = WindowSize(spec, Tokenizer(spec.model.name), "instructions", limiter)
    assert size.limit() == (spec.window.max_items, "items")  # the spec's ceiling
    size.follow_quality(10)
    assert size.limit() == (10, "items")  # the controller's window
    limiter.on_timeout(16)
    assert size.limit() == (8, "output")  # what the endpoint answered in time
    size.follow_quality(40)  # never past the spec's ceiling
    limiter.on_success(0.1, 100, items=8, share_of_timeout=0.01)
    assert size.limit()[0] <= spec.window.max_items
