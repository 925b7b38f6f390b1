"""The bench and soak reports: ratios computed from the results, plots written."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from instanced_stream.errors import StreamError
from instanced_stream_bench.harness import report
from instanced_stream_bench.harness.report import (
    Endpoint,
    Result,
    delivery_lines,
    markdown,
    median_run,
    plots,
)
from instanced_stream_bench.harness.soak import Sample, SoakResult
from instanced_stream_bench.harness.soak import markdown as soak_markdown
from instanced_stream_bench.harness.soak import plot as soak_plot


def _results() -> list[Result]:
    return [
        Result(
            "aiokafka passthrough",
            None,
            items=1000,
            seconds=0.1,
            items_per_s=10_000.0,
            processes=1,
            partitions=4,
        ),
        Result(
            "baseline (window 1)",
            1,
            items=500,
            seconds=50.0,
            items_per_s=10.0,
            requests_per_item=1.0,
            prompt_per_item=600.0,
            completion_per_item=60.0,
            processes=1,
            partitions=4,
        ),
        Result(
            "window 50",
            50,
            items=1000,
            seconds=5.0,
            items_per_s=200.0,
            requests_per_item=0.02,
            prompt_per_item=75.0,
            cached_share=0.5,
            completion_per_item=60.0,
            mean_batch=50.0,
            ceiling_per_s=210.0,
            p50_ms=900,
            p99_ms=1200,
            processes=1,
            partitions=4,
        ),
    ]


def test_markdown_reports_ratios_against_baseline_ceiling_and_passthrough() -> None:
    text = markdown(_results(), Endpoint(), "stream bench --items 1000")
    row = next(line for line in text.splitlines() if line.startswith("| window 50 "))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[3] == "20.0x"  # 200 / 10 items/s
    assert cells[4] == "95%"  # 200 of a 210 items/s ceiling
    assert cells[5] == "2%"  # 200 of 10,000 items/s passthrough
    assert cells[9] == "50%"  # of the prompt tokens were cached
    assert "requests per item 1/50, prompt tokens per item 1/8.0" in text
    assert "Command: `stream bench --items 1000`" in text


def test_plots_are_png_files(tmp_path: Path) -> None:
    paths = plots(_results(), tmp_path)
    assert [p.name for p in paths] == ["bench-throughput.png", "bench-cost.png"]
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in paths)


def test_soak_growth_compares_the_last_third_with_the_first_after_warm_up(tmp_path: Path) -> None:
    samples = [
        Sample(10.0 * k, 100 * k, 10.0, 100.0 + (5.0 if k > 12 else 0.0)) for k in range(1, 19)
    ]
    result = SoakResult(180, 10, 1800, 1800, samples)
    # from the first minute on: 13 samples (60..180 s); thirds of 4: 100 MB, then 105 MB
    assert result.growth_mb == 5.0
    text = soak_markdown(result, "stream bench --soak 180")
    assert "+5.0 MB" in text
    rows = [line for line in text.splitlines() if line.startswith("| ") and "at s" not in line]
    assert rows[-1].startswith("| 180 | 1,800 |")  # the last sample is always shown
    assert soak_plot(result, tmp_path / "soak.png").read_bytes()[:4] == b"\x89PNG"


def test_a_drain_that_lands_in_one_wave_is_timed_from_the_produce() -> None:
    from instanced_stream_bench.harness.load import Tally

    tally = Tally("127.0.0.1:1", [])
    tally.restart()
    tally.restarted_at -= 10.0  # the items were produced ten seconds ago
    now = tally.restarted_at + 10.0
    tally.progress = [(now - 0.01, 25), (now, 50)]  # both waves within milliseconds
    assert 4.9 < tally.rate() < 5.1  # 50 items in 10 s, not 2,500 items/s


def _run(name: str, rate: float) -> Result:
    return Result(name, 50, processes=1, partitions=4, items=100, seconds=1.0, items_per_s=rate)


def test_the_median_run_is_kept_and_names_every_run() -> None:
    runs = [_run("instant", rate) for rate in (900.0, 300.0, 600.0)]
    kept = median_run(runs)
    assert kept is runs[2]
    assert kept.notes == ["median of 3 runs in alternating order (900, 300, 600 items/s)"]
    # An even count keeps the lower middle: the table never shows the luckier of two.
    assert median_run([_run("a", 5.0), _run("b", 1.0)]).name == "b"


def test_the_delivery_modes_are_compared_against_their_targets() -> None:
    by_name = {
        r.name: r
        for r in (
            _run("window 50", 190.0),
            _run("window 50, at least once", 200.0),
            _run("instant simulator, window 50", 700.0),
            _run("instant simulator, window 50, at least once", 1000.0),
        )
    }
    lines = delivery_lines(by_name)
    assert "exactly once 95% of at least once's items/s (target at least 95%: met)" in lines[2]
    assert "exactly once 70% of at least once's items/s (target at least 80%: missed)" in lines[3]
    assert delivery_lines({}) == []


def test_the_judge_is_named_and_the_simulator_refused_without_its_classifier(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert report.judge_of("simulator") == "simulator: classifier"
    assert report.judge_of("local", "smollm2") == "model: smollm2"
    found = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "profanity_check" else found(name, *a),
    )
    with pytest.raises(StreamError, match="not installed; its word rules alone"):
        report.judge_of("simulator")
    assert report.judge_of("http://vllm:8000/v1") == "model: http://vllm:8000/v1"


def test_a_row_is_billed_against_its_own_baseline_when_the_run_has_one() -> None:
    """A model setting run on the prefix variant has a baseline of its own (the setting
    changes the baseline's answer too); a setting run only at the largest window falls
    back to its spec variant's baseline."""

    def row(name: str, usd: float) -> Result:
        window = 1 if name.startswith("baseline") else 50
        return Result(
            name,
            window,
            items=10,
            seconds=1.0,
            items_per_s=10.0,
            processes=1,
            partitions=4,
            cost_by_rule={"openai-0.1x": usd},
        )

    rows = [
        row("baseline (window 1), prefix over 1,024", 6e-05),
        row("window 50, prefix over 1,024", 2e-05),
        row("baseline (window 1), reasoning brief, prefix over 1,024", 5e-05),
        row("window 50, reasoning brief, prefix over 1,024", 1e-05),
        row("baseline (window 1)", 9e-05),
        row("window 50, reasoning brief", 1.5e-05),
    ]
    base = report._baseline_of
    assert base(rows[1], rows) is rows[0]
    assert base(rows[3], rows) is rows[2]
    assert base(rows[5], rows) is rows[4]
    assert base(rows[2], rows) is rows[2]  # a baseline of its own is its own reference
    lines = "\n".join(report.rule_lines(rows))
    assert "1.00e-05 (1/5.0)" in lines and "2.00e-05 (1/3.0)" in lines
    assert "5.00e-05 (1.0x)" in lines
