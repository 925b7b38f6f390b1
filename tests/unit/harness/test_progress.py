"""The restart storm's progress figures from a synthetic timeline: items decided late,
the longest a partition had no open unit, the longest join, rebalances a minute. Each is
cut at the stop: whatever a stop's drain finishes must not make a stuck run look live."""

from __future__ import annotations

from instanced_stream_bench.harness.progress import (
    Member,
    decided_late,
    join_times,
    owned_over_time,
    rebalances_per_min,
    unowned,
)

STOP = 200.0


def test_an_item_is_late_past_its_bound_or_when_decided_only_at_or_after_the_stop() -> None:
    sent = {
        (0, 0): 10.0,  # decided in 5 s: on time
        (0, 1): 20.0,  # decided in 61 s: late
        (1, 0): 30.0,  # never decided: late
        (1, 1): 100.0,  # decided in 110 s, after the stop: late, however the drain went
        (2, 0): 170.0,  # 30 s before the stop, decided 40 s later, after it: late
        (2, 1): 180.0,  # 20 s before the stop, decided at 190: on time
        (2, 2): 150.0,  # decided exactly at the stop: not before it, late
    }
    first = {
        (0, 0): 15.0,
        (0, 1): 81.0,
        (1, 1): 210.0,
        (2, 0): 210.0,
        (2, 1): 190.0,
        (2, 2): STOP,
    }
    found = decided_late(sent, first, STOP, bound_s=60.0)
    assert found["items_counted"] == 7
    assert found["decided_late"] == 5
    assert found["late_partitions"] == [0, 1, 2]
    # Everything decided before the stop within the bound is on time, whatever the bound.
    every = {k: v + 1.0 for k, v in sent.items()}
    assert decided_late(sent, every, STOP)["decided_late"] == 0


def test_a_partition_without_an_open_unit_counts_from_the_poll_that_missed_it() -> None:
    # Partition 1 unowned from 10 to 40 (a kill, a slow join); partition 2 unowned from
    # 150 until after the stop, reopened by a draining member at 205; partition 0
    # unowned only after the stop.
    polls = [(float(t), frozenset({0, 1, 2})) for t in range(0, 10)]
    polls += [(float(t), frozenset({0, 2})) for t in range(10, 40)]
    polls += [(float(t), frozenset({0, 1, 2})) for t in range(40, 150)]
    polls += [(float(t), frozenset({0, 1})) for t in range(150, 205)]
    polls += [(float(t), frozenset({1, 2})) for t in range(205, 300)]
    found = unowned(polls, partitions=3, start=0.0, stop=STOP)
    assert found["unowned_per_partition_s"] == {"1": 30.0, "2": 50.0}
    assert found["max_unowned_s"] == 50.0  # to the stop, not to 205 nor past it
    assert [1, 10.0, 40.0] in found["unowned_spans"]
    # Counting the polls after the stop would say 55 s for partition 2, and 95 for 0.
    assert unowned(polls, 3, 0.0, 300.0)["max_unowned_s"] == 95.0


def test_a_member_that_misses_a_poll_keeps_its_partitions_briefly_a_dead_one_does_not() -> None:
    samples: list[tuple[float, dict[str, list[int] | None]]] = [
        (0.0, {"a": [0, 1], "b": [2]}),
        (1.0, {"a": None, "b": [2]}),  # a busy: still holds 0 and 1
        (2.0, {"a": None, "b": None}),  # b was killed at 1.5: its 2 is gone
        (9.0, {"a": None}),  # a silent for 9 s: no longer counted
    ]
    owned = owned_over_time(samples, {"a": None, "b": 1.5}, stale_s=5.0)
    assert [parts for _, parts in owned] == [
        frozenset({0, 1, 2}),
        frozenset({0, 1, 2}),
        frozenset({0, 1}),
        frozenset(),
    ]


def test_a_member_never_assigned_before_the_stop_weighs_in_the_longest_join() -> None:
    members = [
        Member("p0.0", started=0.0, first_assigned=4.0, ended=None),
        Member("p1.1", started=50.0, first_assigned=None, ended=53.0),  # killed joining
        # Joined at 60 and stayed out until the stop; the drain assigned it at 201.
        Member("p2.1", started=60.0, first_assigned=201.0, ended=None),
    ]
    found = join_times(members, STOP)
    assert found["max_join_s"] == 140.0
    assert found["never_assigned"] == ["p1.1", "p2.1"]
    assert found["max_join_assigned_s"] == 4.0
    assert join_times(members[:1], STOP)["max_join_s"] == 4.0


def test_rebalances_a_minute_are_the_most_generations_in_any_60_s_before_the_stop() -> None:
    # 10 generations in 30 s early on, 2 later, then a livelock of 100 after the stop.
    gens = {g: 10.0 + 3 * g for g in range(10)}
    gens |= {10: 120.0, 11: 150.0}
    gens |= {12 + k: STOP + 0.5 * k for k in range(100)}
    found = rebalances_per_min(gens, STOP)
    assert found == {"rebalances_per_min": 10, "generations": 12}
    assert rebalances_per_min(gens, STOP + 100)["rebalances_per_min"] > 10
