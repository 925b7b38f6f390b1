"""A request's deadline follows the answer it may write at the endpoint's measured pace
(#26 item 7: a CPU model's 100-instance answer timed out, was halved and re-asked)."""

from __future__ import annotations

from instanced_stream.llm.deadline import Deadline


def test_no_measure_no_cap_the_spec_timeout() -> None:
    d = Deadline(60)
    assert d.timeout_for(9_000) == 60 and d.timeout_for(None) == 60


def test_a_slow_endpoint_s_large_answer_gets_the_time_it_needs() -> None:
    d = Deadline(60)
    d.observe(950, 10.0)  # 95 tokens/s, a CPU model
    assert d.timeout_for(9_200) > 60 * 2  # about 9,200 / 95 x 1.5 s
    assert d.timeout_for(100) == 60  # never below the spec's


def test_the_slowest_recent_pace_counts_and_the_deadline_is_bounded() -> None:
    d = Deadline(60)
    d.observe(1_000, 1.0)
    fast = d.timeout_for(9_200)
    d.observe(40, 10.0)  # 4 tokens/s: a loaded machine
    assert d.timeout_for(9_200) > fast
    assert d.timeout_for(9_200) == 600  # at most ten times the spec's timeout
    d.observe(5, 10.0)  # too short to say anything
    assert min(d.rates) == 4.0


def test_the_probe_s_short_answer_is_a_first_measure() -> None:
    d = Deadline(60)
    d.observe(12, 2.0, least=1)
    assert d.rates[0] == 6.0


def test_timeouts_before_any_answer_lengthen_the_deadline_not_only_halve_batches() -> None:
    d = Deadline(60)
    d.timed_out()
    d.timed_out()
    assert d.timeout_for(9_000) == 240
    for _ in range(10):
        d.timed_out()
    assert d.timeout_for(9_000) == 600  # bounded
    d.observe(950, 10.0)  # an answer: its pace decides from now on
    assert d.grow == 1.0 and d.timeout_for(100) == 60
