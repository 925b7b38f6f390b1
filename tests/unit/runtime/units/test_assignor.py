"""The processor group's assignor (runtime/units/assignor.py): partition numbers over
members, balanced within one, sticky, the fewest moved; and its aiokafka wiring (claims in
the join metadata, the epoch in the assignment, every topic's p to one member)."""

from __future__ import annotations

from collections import Counter

import pytest
from aiokafka.coordinator.protocol import (
    ConsumerProtocolMemberAssignment,
    ConsumerProtocolMemberMetadata,
)
from hypothesis import given
from hypothesis import strategies as st
from instanced_stream.runtime.units.assignor import (
    Claim,
    CoPartitionedAssignor,
    assign_numbers,
    fewest_moves,
)

# ------------------------------------------------------------------ helpers


def _claims(assignment: dict[str, list[int]], epoch: int = 0) -> dict[str, Claim]:
    return {m: Claim(epoch, frozenset(ps)) for m, ps in assignment.items()}


def _moved(before: dict[str, list[int]], after: dict[str, list[int]]) -> int:
    """Numbers a member that stays owned before and no longer owns."""
    return sum(len(set(ps) - set(after.get(m, []))) for m, ps in before.items() if m in after)


def _check_valid(out: dict[str, list[int]], members: set[str], count: int) -> None:
    assert set(out) == members
    every = [p for ps in out.values() for p in ps]
    assert sorted(every) == list(range(count))  # each number exactly once
    sizes = [len(ps) for ps in out.values()]
    assert max(sizes) - min(sizes) <= 1


# ------------------------------------------------------------------ examples


def test_a_first_assignment_spreads_every_number_once() -> None:
    out = assign_numbers({"b": Claim(), "a": Claim(), "c": Claim()}, 8)
    _check_valid(out, {"a", "b", "c"}, 8)
    assert out == {"a": [0, 1, 2], "b": [3, 4, 5], "c": [6, 7]}


def test_the_same_group_keeps_every_number_where_it_was() -> None:
    before = {"a": [1, 4, 5], "b": [0, 2, 7], "c": [3, 6]}  # not the fresh layout
    assert assign_numbers(_claims(before), 8) == before


def test_a_join_moves_only_what_the_new_member_gets() -> None:
    before = assign_numbers({"a": Claim(), "b": Claim()}, 12)  # 6 and 6
    after = assign_numbers({**_claims(before), "c": Claim()}, 12)
    _check_valid(after, {"a", "b", "c"}, 12)
    assert len(after["c"]) == 4
    assert _moved(before, after) == 4  # two from each, nothing shuffled between a and b
    assert set(after["a"]) <= set(before["a"]) and set(after["b"]) <= set(before["b"])


def test_a_leave_moves_only_the_leavers_numbers() -> None:
    before = assign_numbers({"a": Claim(), "b": Claim(), "c": Claim()}, 12)
    claims = _claims(before)
    del claims["b"]
    after = assign_numbers(claims, 12)
    _check_valid(after, {"a", "c"}, 12)
    assert _moved(before, after) == 0
    assert set(before["a"]) <= set(after["a"]) and set(before["c"]) <= set(after["c"])


def test_the_newer_claim_wins_a_number_claimed_twice() -> None:
    # `old` was put out of the group at epoch 3 and still claims 0-2; `new` got 0-2 at 4.
    claims = {"old": Claim(3, frozenset({0, 1, 2})), "new": Claim(4, frozenset({0, 1, 2, 3}))}
    out = assign_numbers(claims, 6)
    _check_valid(out, {"old", "new"}, 6)
    assert out["new"] == [0, 1, 2]  # it keeps three (its share); old gets what is left
    assert out["old"] == [3, 4, 5]


def test_numbers_past_the_count_and_no_members_are_harmless() -> None:
    assert assign_numbers({}, 4) == {}
    out = assign_numbers({"a": Claim(0, frozenset({9, 1}))}, 3)
    assert out == {"a": [0, 1, 2]}
    assert assign_numbers({"a": Claim(), "b": Claim()}, 0) == {"a": [], "b": []}


def test_the_larger_owner_keeps_the_extra_number() -> None:
    # 7 over 2: one member keeps 4. a owns 5, b owns 2: a keeps 4, one moves to b.
    claims = {"a": Claim(0, frozenset({0, 1, 2, 3, 4})), "b": Claim(0, frozenset({5, 6}))}
    out = assign_numbers(claims, 7)
    assert out == {"a": [0, 1, 2, 3], "b": [4, 5, 6]}
    assert fewest_moves(claims, 7) == 1


def test_claims_travel_as_bytes_and_bad_ones_own_nothing() -> None:
    claim = Claim(7, frozenset({3, 1}))
    assert Claim.decode(claim.encode()) == claim
    assert Claim.decode(b"") == Claim()
    assert Claim.decode(b"\x00\x01 not json") == Claim()
    assert Claim.decode(b'{"epoch": "x", "partitions": []}') == Claim()


# ------------------------------------------------------------------ properties

_ids = st.sets(st.sampled_from("abcdefgh"), min_size=1, max_size=6)


@st.composite
def _groups(draw: st.DrawFn) -> tuple[dict[str, Claim], int]:
    """Members with arbitrary claims (overlapping, stale, past the count) and a count."""
    members = draw(_ids)
    count = draw(st.integers(0, 40))
    numbers = st.frozensets(st.integers(0, 45), max_size=12)
    claims = {m: Claim(draw(st.integers(-1, 5)), draw(numbers)) for m in members}
    return claims, count


@given(_groups())
def test_every_number_once_balanced_within_one(group: tuple[dict[str, Claim], int]) -> None:
    claims, count = group
    _check_valid(assign_numbers(claims, count), set(claims), count)


@given(_groups())
def test_the_fewest_numbers_move(group: tuple[dict[str, Claim], int]) -> None:
    claims, count = group
    out = assign_numbers(claims, count)
    # What the members own after the claims are settled (the newest claim wins).
    owner: dict[int, tuple[int, str]] = {}
    for m in sorted(claims):
        for p in claims[m].partitions:
            if p < count and (p not in owner or claims[m].epoch > owner[p][0]):
                owner[p] = (claims[m].epoch, m)
    moved = sum(1 for p, (_, m) in owner.items() if p not in out[m])
    assert moved == fewest_moves(claims, count)


@given(_groups(), st.randoms())
def test_deterministic_whatever_the_order(group: tuple[dict[str, Claim], int], rng: object) -> None:
    claims, count = group
    items = list(claims.items())
    rng.shuffle(items)  # type: ignore[attr-defined]
    assert assign_numbers(dict(items), count) == assign_numbers(claims, count)


@given(st.integers(1, 6), st.integers(0, 40))
def test_a_stable_group_is_a_fixed_point(members: int, count: int) -> None:
    ids = [f"m{k}" for k in range(members)]
    first = assign_numbers({m: Claim() for m in ids}, count)
    assert assign_numbers(_claims(first), count) == first


@given(st.integers(1, 6), st.integers(0, 40), st.data())
def test_a_join_or_a_leave_moves_no_more_than_it_must(
    members: int, count: int, data: st.DataObject
) -> None:
    ids = [f"m{k}" for k in range(members)]
    before = assign_numbers({m: Claim() for m in ids}, count)
    # A join: the stayers give up only what the newcomer needs, each at most its excess.
    joined = assign_numbers({**_claims(before), "new": Claim()}, count)
    _check_valid(joined, {*ids, "new"}, count)
    assert _moved(before, joined) == len(joined["new"]) == count // (members + 1)
    # A leave: only the leaver's numbers move.
    if members > 1:
        gone = data.draw(st.sampled_from(ids))
        left = assign_numbers({m: c for m, c in _claims(before).items() if m != gone}, count)
        assert _moved(before, left) == 0
        assert Counter(p for ps in left.values() for p in ps) == Counter(range(count))


# ------------------------------------------------------------------ the aiokafka wiring


class _Cluster:
    """What the assignor asks of aiokafka's ClusterMetadata."""

    def __init__(self, counts: dict[str, int]) -> None:
        self.counts = counts

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        n = self.counts.get(topic)
        return None if n is None else set(range(n))


def _join(assignor: CoPartitionedAssignor, topics: list[str]) -> ConsumerProtocolMemberMetadata:
    """The metadata a member sends, through the bytes the broker carries."""
    sent = assignor.metadata(topics).encode()
    return ConsumerProtocolMemberMetadata.decode(sent)


def _deliver(
    assignor: CoPartitionedAssignor, given: ConsumerProtocolMemberAssignment
) -> dict[str, list[int]]:
    got = ConsumerProtocolMemberAssignment.decode(given.encode())
    assignor.on_assignment(got)
    return dict(got.assignment)


def test_every_topic_of_a_number_goes_to_one_member_and_claims_come_back() -> None:
    topics = ["in", "results", "approvals"]
    cluster = _Cluster(dict.fromkeys(topics, 6))
    a, b = CoPartitionedAssignor(), CoPartitionedAssignor()
    first = a.assign(cluster, {"A": _join(a, topics), "B": _join(b, topics)})
    got_a, got_b = _deliver(a, first["A"]), _deliver(b, first["B"])
    assert got_a == {t: [0, 1, 2] for t in topics}
    assert got_b == {t: [3, 4, 5] for t in topics}
    assert a.claim == Claim(0, frozenset({0, 1, 2}))
    # C joins; b is the leader this time: a and b each give up one number, all topics.
    c = CoPartitionedAssignor()
    second = b.assign(
        cluster, {"A": _join(a, topics), "B": _join(b, topics), "C": _join(c, topics)}
    )
    got = {m: _deliver(x, second[m]) for m, x in (("A", a), ("B", b), ("C", c))}
    for m in got:
        assert len({tuple(ps) for ps in got[m].values()}) == 1  # the same numbers per topic
    assert set(got["A"]["in"]) < {0, 1, 2} and set(got["B"]["in"]) < {3, 4, 5}
    assert len(got["C"]["in"]) == 2
    assert a.claim.epoch == b.claim.epoch == c.claim.epoch == 1


def test_a_topic_with_fewer_partitions_gets_only_the_numbers_it_has() -> None:
    cluster = _Cluster({"in": 4, "results": 2})
    a = CoPartitionedAssignor()
    out = a.assign(cluster, {"A": _join(a, ["in", "results"])})
    assert dict(out["A"].assignment) == {"in": [0, 1, 2, 3], "results": [0, 1]}


class _Trap:
    """A probe that raises at one point, as an armed `raise:` fault does."""

    def __init__(self, point: str) -> None:
        self.point, self.seen = point, 0

    def at(self, point: str) -> None:
        if point == self.point:
            self.seen += 1
            raise RuntimeError(point)

    def watches(self, point: str) -> bool:
        return point == self.point


def test_the_joined_point_comes_before_the_member_takes_its_partitions() -> None:
    """The restart storm's `joined` kill (harness/kills.py) dies where the group has answered
    the join and the member holds nothing yet: its claim is still the one it joined with."""
    topics = ["in", "results", "approvals"]
    trap = _Trap("joined")
    a = CoPartitionedAssignor(trap)
    given = a.assign(_Cluster(dict.fromkeys(topics, 4)), {"A": _join(a, topics)})
    with pytest.raises(RuntimeError, match="joined"):
        _deliver(a, given["A"])
    assert trap.seen == 1
    assert a.claim == Claim()
    assert _deliver(CoPartitionedAssignor(), given["A"]) == {t: [0, 1, 2, 3] for t in topics}
