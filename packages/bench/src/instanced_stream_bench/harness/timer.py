"""`stream bench --timer`: what the expiry timer's index (`core.expiry.DueIndex`) costs the
event loop and memory at a given count of finished workflow states, at unit level (no
broker, no model): the states are indexed as a restore indexes them
(`DueIndex.reindex`, partition by partition) while a probe task measures how long the loop
goes without running it.

Beside it, in the same run, the index as it was before (one dict scanned whole at every
tick, a partition re-indexed in one go), rebuilt here as a baseline, so the figures are
comparable on the same machine and load."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import random
import statistics
import time
import tracemalloc
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import orjson
from instanced_stream.core.expiry import MOST_PER_TICK, DueIndex
from instanced_stream.runtime.state.store import Retired

__all__ = ["TimerFigures", "measure", "timer_command"]

RETENTION_S = 86_400.0  # the default `state_retention_s`
_PROBE_S = 0.001  # how often the probe task asks to run


@dataclass(frozen=True)
class TimerFigures:
    """One index's figures; ms are wall-clock milliseconds on this machine."""

    name: str
    states: int
    partitions: int
    idle_tick_ms_median: float  # a tick with nothing due, CPU time
    idle_tick_ms_p99: float
    idle_tick_ms_max: float
    full_tick_ms: float  # a tick with every state due (the heap hands out its most), CPU
    reindex_s: float  # every partition indexed again, as restores do (wall)
    longest_stall_ms: float  # the longest the loop ran other work, CPU time
    longest_stall_wall_ms: float  # the same in wall time: waits for a core included
    index_bytes_per_state: float  # the index alone (the names are the store's)
    store_bytes_per_state: float  # the store's own record of a finished state
    collection_ms: float  # a full collection of the cyclic collector with the index held
    collection_without_ms: float  # the same before any index (the states listed only)


class _ScanIndex:
    """The index before the heap: instance -> (due, partition), scanned whole by `due`."""

    def __init__(self) -> None:
        self._due: dict[str, tuple[float, int]] = {}

    def retire(self, instance: str, ended_at: float, partition: int) -> None:
        self._due[instance] = (ended_at + RETENTION_S, partition)

    def due(self, now: float, owns: Callable[[int], bool]) -> list[str]:
        return [name for name, (when, part) in self._due.items() if when < now and owns(part)]

    async def reindex(self, retired: list[tuple[str, float, int]]) -> None:
        for retiree in retired:  # the old restore: no yield while indexing retirees
            self.retire(*retiree)


def _finished(states: int, partitions: int, seed: int = 7) -> list[list[tuple[str, float, int]]]:
    """Finished states as a store lists them (instance, ended at, partition), by
    partition, ended over the last hour (none is past its retention)."""
    rng = random.Random(seed)
    now = time.time()
    out: list[list[tuple[str, float, int]]] = [[] for _ in range(partitions)]
    for i in range(states):
        p = i % partitions
        out[p].append((f"done-{i:08d}", now - rng.uniform(0, 3600), p))
    for part in out:
        part.sort(key=lambda r: r[1])  # a changelog holds them about in the order they ended
    return out


def _bytes_of(build: Callable[[], Any]) -> tuple[int, Any]:
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    built = build()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return after - before, built


def _all(by_partition: list[list[tuple[str, float, int]]]) -> Iterator[tuple[str, float, int]]:
    for part in by_partition:
        yield from part


class _Probe:
    """A task that asks to run every millisecond and keeps the longest wait beyond that,
    in wall time and in the CPU time of the loop's thread: on a shared machine the wall time also
    counts the waits for a core, which the CPU time leaves out."""

    def __init__(self) -> None:
        self.longest = 0.0
        self.longest_cpu = 0.0
        self._stop = False

    async def run(self) -> None:
        while not self._stop:
            asked, asked_cpu = time.perf_counter(), time.thread_time()
            await asyncio.sleep(_PROBE_S)
            self.longest = max(self.longest, time.perf_counter() - asked - _PROBE_S)
            self.longest_cpu = max(self.longest_cpu, time.thread_time() - asked_cpu)

    def stop(self) -> None:
        self._stop = True


@contextlib.contextmanager
def _no_collector() -> Iterator[None]:
    """The cyclic collector held off: a full collection visits every object the process
    holds, whatever allocated last, so it is measured on its own (`_full_collection_ms`)."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _full_collection_ms() -> float:
    started = time.thread_time()
    gc.collect()
    return (time.thread_time() - started) * 1000


def _ticks(due: Callable[[], object], count: int) -> tuple[list[float], list[float]]:
    """`count` ticks: each one's wall and CPU milliseconds."""
    wall, cpu = [], []
    with _no_collector():
        for _ in range(count):
            started, started_cpu = time.perf_counter(), time.thread_time()
            due()
            wall.append((time.perf_counter() - started) * 1000)
            cpu.append((time.thread_time() - started_cpu) * 1000)
    return wall, cpu


async def _under_probe(work: Callable[[], Any]) -> tuple[float, float, float]:
    """Runs `work` (a coroutine factory) beside the probe; returns its seconds and the
    probe's longest stall, wall and CPU (ms)."""
    probe = _Probe()
    with _no_collector():
        probing = asyncio.create_task(probe.run())
        await asyncio.sleep(0.01)
        started = time.perf_counter()
        await work()
        took = time.perf_counter() - started
        await asyncio.sleep(0.01)
        probe.stop()
        await probing
    return took, probe.longest * 1000, probe.longest_cpu * 1000


def _heap_figures(
    by_partition: list[list[tuple[str, float, int]]], states: int, without: float
) -> TimerFigures:
    size, index = _bytes_of(lambda: _filled_heap(by_partition))
    now = time.time()

    def owns(_: int) -> bool:
        return True

    idle_wall, idle = _ticks(lambda: index.due(now, owns), 1000)

    async def reindex_all() -> None:
        # Every partition restored again into the index that holds it (its old part
        # cleared first, as a restore does), beside ticks as the service's, only more often.
        ticking = asyncio.create_task(_ticking(lambda: index.due(now, owns)))
        for p, retired in enumerate(by_partition):
            await index.reindex(p, (), retired)
        ticking.cancel()

    took, stall_wall, stall = asyncio.run(_under_probe(reindex_all))
    later = now + RETENTION_S + 3600  # every state past its retention
    full_wall, full = (t[0] for t in _ticks(lambda: index.due(later, owns), 1))
    return _figures(
        "heap (now)",
        by_partition,
        states,
        size,
        (idle, idle_wall),
        (full, full_wall),
        (took, stall, stall_wall),
        without,
    )


def _filled_heap(by_partition: list[list[tuple[str, float, int]]]) -> DueIndex:
    index = DueIndex(RETENTION_S)
    for retiree in _all(by_partition):
        index.retire(*retiree)
    return index


async def _ticking(tick: Callable[[], object]) -> None:
    while True:
        tick()
        await asyncio.sleep(0.05)


def _scan_figures(
    by_partition: list[list[tuple[str, float, int]]], states: int, without: float
) -> TimerFigures:

    def fill() -> _ScanIndex:
        index = _ScanIndex()
        for retiree in _all(by_partition):
            index.retire(*retiree)
        return index

    size, index = _bytes_of(fill)
    now = time.time()

    def owns(_: int) -> bool:
        return True

    idle_wall, idle = _ticks(lambda: index.due(now, owns), 5)  # each visits every state

    async def reindex_all() -> None:
        for retired in by_partition:  # into the index that holds them, as restores did
            await index.reindex(retired)
            await asyncio.sleep(0)

    took, stall_wall, stall = asyncio.run(_under_probe(reindex_all))
    later = now + RETENTION_S + 3600
    full_wall, full = (t[0] for t in _ticks(lambda: index.due(later, owns), 1))
    return _figures(
        "scan (before)",
        by_partition,
        states,
        size,
        (idle, idle_wall),
        (full, full_wall),
        (took, stall, stall_wall),
        without,
    )


def _figures(
    name: str,
    by_partition: list[list[tuple[str, float, int]]],
    states: int,
    size: int,
    idle_ticks: tuple[list[float], list[float]],
    full_tick: tuple[float, float],
    reindexed: tuple[float, float, float],
    without: float,
) -> TimerFigures:
    """One index's row: its ticks' CPU and wall times, the re-index's seconds and stalls,
    its bytes and the collector's pause, measured the same way for both indexes."""
    (idle, idle_wall), (full, full_wall), (took, stall, stall_wall) = (
        idle_ticks,
        full_tick,
        reindexed,
    )
    collection = _full_collection_ms()  # first, as the runs measured it: before the store's bytes
    p99 = sorted(idle)[len(idle) * 99 // 100]
    return TimerFigures(
        name=name,
        states=states,
        partitions=len(by_partition),
        idle_tick_ms_median=statistics.median(idle),
        idle_tick_ms_p99=p99,
        idle_tick_ms_max=max(idle),
        full_tick_ms=full,
        reindex_s=took,
        longest_stall_ms=max(stall, full, p99),
        longest_stall_wall_ms=max(stall_wall, full_wall, max(idle_wall)),
        index_bytes_per_state=size / states,
        store_bytes_per_state=_store_bytes(by_partition) / states,
        collection_ms=collection,
        collection_without_ms=without,
    )


def _store_bytes(by_partition: list[list[tuple[str, float, int]]]) -> int:
    """What a store keeps of each finished state (`Retired` by instance), the same for
    both indexes: measured, not read from the store's internals."""
    size, _ = _bytes_of(
        lambda: [
            {name: Retired(n, at) for n, (name, at, _) in enumerate(part)} for part in by_partition
        ]
    )
    return size


def measure(states: int, partitions: int, baseline: bool = True) -> list[TimerFigures]:
    """The heap index's figures, and the scan's beside them when `baseline`."""
    by_partition = _finished(states, partitions)
    without = _full_collection_ms()  # the states (as a store lists them) and no index
    out = [_heap_figures(by_partition, states, without)]
    if baseline:
        out.append(_scan_figures(by_partition, states, without))
    return out


def _table(figures: list[TimerFigures]) -> str:
    rows = [
        "| index | idle tick median / p99 (ms) | tick, all due (ms) | "
        "re-index all (s) | longest stall (ms; wall) | "
        "index bytes / state | store bytes / state | full collection (ms), without it |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for f in figures:
        rows.append(
            f"| {f.name} | {f.idle_tick_ms_median:.3f} / {f.idle_tick_ms_p99:.3f} | "
            f"{f.full_tick_ms:.1f} | {f.reindex_s:.2f} | {f.longest_stall_ms:.1f}; "
            f"{f.longest_stall_wall_ms:.0f} | {f.index_bytes_per_state:.0f} | "
            f"{f.store_bytes_per_state:.0f} | {f.collection_ms:.0f}, "
            f"{f.collection_without_ms:.0f} |"
        )
    rows.append(
        "(ms: the CPU time of the loop's thread; wall time also counts the waits for a core on a "
        f"shared machine. A tick with all due: the heap hands out its first {MOST_PER_TICK:,}, "
        "the scan every one. Ticks and stalls are measured with the cyclic collector held "
        "off; what one of its full collections costs, with and without the index, is the "
        "last column)"
    )
    return "\n".join(rows)


def timer_command(states: int, partitions: int, out: Path, baseline: bool = True) -> int:
    figures = measure(states, partitions, baseline)
    first = figures[0]
    print(f"expiry timer at {states:,} finished states on {partitions} partitions")
    print(_table(figures))
    out.mkdir(parents=True, exist_ok=True)
    (out / "timer.json").write_bytes(
        orjson.dumps([asdict(f) for f in figures], option=orjson.OPT_INDENT_2)
    )
    held = first.idle_tick_ms_median < 1.0 and first.longest_stall_ms < 50.0
    print(
        "targets (idle tick under 1 ms, no stall over 50 ms): " + ("held" if held else "NOT held")
    )
    return 0 if held else 1
