"""Adaptive concurrency (AIMD) and the window cap it keeps after timeouts, without a network."""

from __future__ import annotations

import asyncio
import time

import pytest
from instanced_stream.llm.limiter import Limiter


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
