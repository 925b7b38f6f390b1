"""The spend pacer (core/budget.py): a request starts while the spend is at most
`burst_s` ahead of the ceiling's even pace, requests in flight count at their mean cost,
and the figures the live page shows."""

from __future__ import annotations

import pytest
from instanced_stream.core.budget import Budget, Pacer


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_no_ceiling_never_waits() -> None:
    pacer = Pacer(Budget(), Clock())
    pacer.started()
    pacer.ended(1_000.0)
    assert pacer.delay() == 0 and pacer.met_in_s() is None and not pacer.limited


def test_spend_ahead_of_the_pace_holds_the_next_request_until_it_is_within_the_burst() -> None:
    clock = Clock()
    pacer = Pacer(Budget(usd_per_hour=3.6, burst_s=2), clock)  # 0.001 USD a second
    pacer.started()
    pacer.ended(0.005)  # five seconds' worth at once
    assert pacer.delay() == 3.0  # 5 s ahead, 2 s of burst allowed
    clock.now += 3.0
    assert pacer.delay() == 0.0


def test_requests_in_flight_count_at_their_mean_cost() -> None:
    clock = Clock()
    pacer = Pacer(Budget(usd_per_hour=3.6, burst_s=2), clock)
    pacer.started()
    pacer.ended(0.001)  # one second's worth: the mean request
    clock.now += 1.0
    assert pacer.delay() == 0.0
    for _ in range(4):
        pacer.started()
    assert pacer.delay() == 2.0  # four seconds' worth in flight, two of burst


def test_the_tighter_ceiling_rules() -> None:
    assert Budget(usd_per_hour=10, usd_per_day=24).usd_per_s == 24 / 86400
    assert Budget(usd_per_hour=0.5, usd_per_day=240).usd_per_s == 0.5 / 3600


def test_the_rate_what_is_left_and_when_the_ceiling_is_met() -> None:
    clock = Clock()
    pacer = Pacer(Budget(usd_per_hour=3.6, burst_s=60), clock)
    pacer.record(0.0)
    clock.now += 10
    pacer.record(0.02)  # 0.002 USD a second: twice the ceiling
    assert round(pacer.rate_per_hour(), 6) == 7.2
    assert pacer.headroom_per_hour() == 0.0
    # 20 s ahead of the pace, 40 s of burst left, drained at 1 s a second
    assert pacer.met_in_s() == 40.0
    clock.now += 30
    pacer.record(0.02)
    assert pacer.met_in_s() is None  # spending nothing now: not met at this rate


def test_stream_topics_says_the_rate_what_is_left_and_when_the_ceiling_is_met() -> None:
    from instanced_stream.ops.console import budget_line

    shown = {"usd_per_hour": 2.0, "spend_usd_per_hour": 1.5, "headroom_usd_per_hour": 0.5}
    assert budget_line({**shown, "met_in_s": None, "paced": False}, "p") == (
        "budget: spend 1.5000 USD/h of 2.0000, left 0.5000 USD/h; not at this rate"
    )
    assert budget_line({**shown, "met_in_s": 90.0, "paced": False}, "p").endswith(
        "met in 90 s at this rate"
    )
    assert budget_line({**shown, "met_in_s": 0.0, "paced": True}, "p").endswith(
        "paced now: input held"
    )
    assert budget_line(None, "http://x") == "budget: no processor page answered at http://x"


def test_each_member_of_a_group_keeps_its_partitions_share_of_the_ceiling() -> None:
    # Three processors on 24 partitions: one owning 8 spends at a third of the ceiling,
    # so together they keep to it; alone again, it keeps to all of it.
    clock = Clock()
    pacer = Pacer(Budget(usd_per_hour=3.6, burst_s=2), clock)  # 0.001 USD a second
    pacer.owns(8, of=24)
    pacer.started()
    pacer.ended(0.001)  # one second's worth of the whole ceiling: three of its third
    assert pacer.delay() == pytest.approx(1.0)  # 3 s ahead of its pace, 2 s of burst
    assert pacer.usd_per_s == pytest.approx(0.001 / 3)
    pacer.owns(24, of=24)
    assert pacer.usd_per_s == 0.001
    pacer.owns(0, of=24)  # owns nothing: a trickle, never a division by zero
    assert pacer.usd_per_s is not None and pacer.usd_per_s > 0
