from __future__ import annotations

import asyncio
import functools
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

from faust.types import TP

from instanced_stream.runtime.app import _cap_commits
from instanced_stream.runtime.offsets import OffsetLedger
from instanced_stream.runtime.windowing import Windower


def test_out_of_order_finish_acks_only_in_offset_order() -> None:
    ledger = OffsetLedger()
    acked: list[int] = []
    entries = [
        ledger.track(("t", 0), off, functools.partial(acked.append, off)) for off in range(5)
    ]
    other = ledger.track(("t", 1), 0, lambda: acked.append(100))
    ledger.finish(entries[2])
    ledger.finish(entries[1])
    assert acked == []  # offset 0 still open: nothing may be committed past it
    ledger.finish(entries[0])
    assert acked == [0, 1, 2]
    ledger.finish(other)
    assert acked == [0, 1, 2, 100]
    assert ledger.lowest_open(("t", 0)) == 3


def test_revoked_partition_is_never_acked() -> None:
    ledger = OffsetLedger()
    acked: list[int] = []
    e = ledger.track(("t", 0), 0, lambda: acked.append(0))
    assert ledger.drop([("t", 0)]) == 1
    ledger.finish(e)
    assert acked == []
    assert ledger.open_count() == 0


async def test_window_closes_on_items_tokens_and_wait() -> None:
    closed: list[tuple[list[int], str]] = []

    async def on_close(items: list[int], reason: str) -> None:
        closed.append((items, reason))

    w: Windower[int] = Windower(
        max_items=3, max_wait_s=0.05, max_tokens=100, on_close=on_close, tokens_of=lambda n: n
    )
    w.start()
    for n in (1, 2, 3):
        await w.add(n)
    assert closed == [([1, 2, 3], "items")]
    await w.add(60)
    await w.add(50)  # would exceed 100 tokens: the window closes before it
    assert closed[-1] == ([60], "tokens")
    await asyncio.sleep(0.15)
    assert closed[-1] == ([50], "wait")
    await w.stop()


async def test_a_loose_bound_closes_windows_where_exact_counts_would() -> None:
    """Items are counted exactly only when their bounds cannot prove the window fits;
    the windows close on tokens exactly where exact counts alone would close them."""
    closed: list[tuple[list[int], str]] = []
    counted: list[int] = []

    async def on_close(items: list[int], reason: str) -> None:
        closed.append((items, reason))

    def exact(n: int) -> int:
        counted.append(n)
        return n

    w: Windower[int] = Windower(
        max_items=10,
        max_wait_s=5,
        max_tokens=100,
        on_close=on_close,
        tokens_of=exact,
        bound_of=lambda n: 2 * n,
    )
    for n in (10, 20, 15):  # bounds 20 + 40 + 30 = 90: no count needed
        await w.add(n)
    assert counted == [] and closed == []
    await w.add(30)  # bound 60 passes 100: the window is counted, 45 + 30 fits
    assert counted == [10, 20, 15, 30] and closed == []
    await w.add(26)  # 75 + 26 would pass 100: closes before it
    assert closed == [([10, 20, 15, 30], "tokens")]
    await w.flush()
    assert closed[-1] == ([26], "flush")


def test_the_commit_point_never_passes_unfinished_records() -> None:
    ledger = OffsetLedger()
    tp = ("t", 0)
    assert ledger.commit_point(tp) is None  # nothing known here yet: commit nothing
    entries = [ledger.track(tp, o, lambda: None) for o in range(10, 14)]
    ledger.finish(entries[0])
    assert ledger.commit_point(tp) is None  # nor before where reading began is known
    ledger.begin(tp, 10)
    assert ledger.commit_point(tp) == 11
    for e in entries[1:]:
        ledger.finish(e)
    assert ledger.commit_point(tp) == 14


def test_revoked_partition_that_comes_back_is_rewound_and_held() -> None:
    ledger = OffsetLedger()
    tp = ("t", 2)
    done = [ledger.track(tp, o, lambda: None) for o in range(38, 41)]
    for e in done:
        ledger.finish(e)
    ledger.track(tp, 41, lambda: None)  # in flight when the rebalance lands
    ledger.drop([tp])
    assert ledger.rewinds([tp, ("t", 0)]) == {tp: 41}
    assert ledger.rewinds([tp]) == {}  # handed out once
    # records fetched before the rebalance may still arrive before the re-read ones
    late = ledger.track(tp, 60, lambda: None)
    again = ledger.track(tp, 41, lambda: None)
    ledger.begin(tp, 41)  # the committed offset, learnt by the continuity watch
    ledger.finish(late)
    assert ledger.commit_point(tp) == 41  # never past the re-read record
    ledger.finish(again)
    assert ledger.commit_point(tp) == 42  # 42..59 are re-read next: no further yet


def test_faust_commits_the_ledgers_point_and_keeps_its_acks_until_there_is_one() -> None:
    drained: list[str] = []

    def proposed(tp: TP) -> int | None:
        drained.append(tp.topic)
        return 99  # faust's own view (it counts records it skipped itself)

    def pending(topics: Any = None) -> Iterator[TP]:
        return iter([TP("results", 0)])  # faust holds acks for results only

    assigned = {TP("items", 0), TP("items", 1), TP("results", 0), TP("other", 0)}
    app = SimpleNamespace(
        consumer=SimpleNamespace(
            _new_offset=proposed,
            _filter_tps_with_pending_acks=pending,
            assignment=lambda: assigned,
        )
    )
    ledger = OffsetLedger()
    _cap_commits(app, ledger, {"items", "results"}, "items")  # type: ignore[arg-type]
    new_offset = app.consumer._new_offset
    ledger.finish(ledger.track(("items", 0), 4, lambda: None))
    assert new_offset(TP("items", 0)) is None and drained == []  # asked again later
    ledger.begin(("items", 0), 4)
    assert new_offset(TP("items", 0)) == 5 and drained == ["items"]
    assert new_offset(TP("other", 0)) == 99  # untracked topics are faust's alone
    # The fed topic's records never reach faust, so it holds no acks for them: every
    # assigned partition of it is offered for a commit all the same.
    offered = set(app.consumer._filter_tps_with_pending_acks())
    assert offered == {TP("results", 0), TP("items", 0), TP("items", 1)}
    assert set(app.consumer._filter_tps_with_pending_acks({"results"})) == {TP("results", 0)}
