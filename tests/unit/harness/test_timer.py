"""The expiry timer's bench (`stream bench --timer`): its figures come from the index the
processor runs, beside the whole-scan index it replaced."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from instanced_stream_bench.harness.timer import measure, timer_command


def test_the_heap_ticks_far_faster_than_the_scan_when_nothing_is_due() -> None:
    heap, scan = measure(20_000, 4)
    assert (heap.name, scan.name) == ("heap (now)", "scan (before)")
    # The scan visits 20,000 states a tick; the heap looks at four tops.
    assert heap.idle_tick_ms_median * 20 < scan.idle_tick_ms_median
    assert 40 < heap.index_bytes_per_state < 400  # the names are the store's, not counted
    assert heap.store_bytes_per_state > 0 and heap.reindex_s > 0


def test_the_command_writes_its_figures_and_says_whether_the_targets_held(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = timer_command(5_000, 2, tmp_path, baseline=False)
    written = orjson.loads((tmp_path / "timer.json").read_bytes())
    assert [(f["name"], f["states"], f["partitions"]) for f in written] == [
        ("heap (now)", 5_000, 2)
    ]
    held = written[0]["idle_tick_ms_median"] < 1 and written[0]["longest_stall_ms"] < 50
    assert code == (0 if held else 1)
    shown = capsys.readouterr().out
    assert "5,000 finished states on 2 partitions" in shown
    assert ("targets (idle tick under 1 ms, no stall over 50 ms): held" in shown) == held
