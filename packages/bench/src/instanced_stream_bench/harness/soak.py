"""`stream bench --soak SECONDS`: steady load for a long time; memory must stay flat.

One processor, window 50, the simulated endpoint of `stream bench`, items produced at a
steady rate (by default half of what the endpoint allows). Every ten seconds it samples
the processor's resident memory, the items done and the throughput since the last
sample. A leak shows as memory that grows with the items processed; the verdict compares
the last third of the run with the first third after warm-up, so start-up allocation
(imports, the classifier, first buffers) is not mistaken for growth.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path

from instanced_stream_bench.harness.bench import Bench, bench_session, bench_spec
from instanced_stream_bench.harness.load import Tally, produce_items, rss_mb
from instanced_stream_bench.harness.report import Endpoint

__all__ = ["Sample", "SoakResult", "markdown", "plot", "run_soak", "soak"]

_EVERY_S = 10.0


@dataclass(frozen=True, slots=True)
class Sample:
    at_s: float
    done: int
    items_per_s: float
    rss_mb: float


@dataclass(slots=True)
class SoakResult:
    seconds: float
    rate: float
    produced: int
    done: int
    samples: list[Sample] = field(default_factory=list)

    @property
    def growth_mb(self) -> float:
        """Mean RSS of the last third minus the first third (after the first minute)."""
        steady = [s for s in self.samples if s.at_s >= 60] or self.samples
        third = max(1, len(steady) // 3)
        first = sum(s.rss_mb for s in steady[:third]) / third
        last = sum(s.rss_mb for s in steady[-third:]) / third
        return last - first


async def soak(bench: Bench, seconds: float, rate: float | None = None) -> SoakResult:
    endpoint = bench.endpoint
    if bench.sim is not None:
        await bench.sim.configure(endpoint.config())
    window, in_flight = 50, endpoint.concurrency * 2
    settings, outcome_topics, procs = await bench.deploy(window, in_flight, 4, 1)
    if rate is None:
        per_request_s = (endpoint.latency_ms + endpoint.per_output_token_ms * 60 * window) / 1000
        rate = 0.5 * endpoint.concurrency * window / per_request_s
    proc = procs[0]
    result = SoakResult(seconds, rate, 0, 0)
    async with Tally(bench.bootstrap, outcome_topics) as tally:
        proc.start()
        await produce_items(bench.bootstrap, settings.topics.input, [bench.items[0]])
        await tally.wait_for(1, 180, procs)
        started = time.monotonic()
        producing = asyncio.create_task(_steady(bench, settings.topics.input, rate, seconds))
        last_done, last_at = len(tally.done), started
        try:
            while not producing.done():
                await asyncio.sleep(_EVERY_S)
                if proc.proc is None or proc.proc.poll() is not None:
                    raise RuntimeError(f"processor exited during the soak:\n{proc.tail()}")
                now, done = time.monotonic(), len(tally.done)
                result.samples.append(
                    Sample(
                        round(now - started, 1),
                        done,
                        (done - last_done) / (now - last_at),
                        rss_mb(proc.proc.pid) or 0.0,
                    )
                )
                last_done, last_at = done, now
            result.produced = await producing
            await tally.wait_for(result.produced + 1, 120, procs, since=time.monotonic())
            result.done = len(tally.done) - 1
        finally:
            producing.cancel()
            proc.stop()
    return result


async def run_soak(
    bootstrap: str, seconds: float, endpoint: Endpoint, rate: float | None = None
) -> SoakResult:
    async with bench_session(bootstrap, endpoint, 20_000, 60, 0, bench_spec()) as bench:
        return await soak(bench, seconds, rate)


async def _steady(bench: Bench, topic: str, rate: float, seconds: float) -> int:
    """Produces at `rate` for `seconds`, cycling through the bench's items with new ids."""
    sent, lap = 0, 0
    started = time.monotonic()
    chunk = max(1, int(rate))  # one second's worth per call
    while time.monotonic() - started < seconds:
        lap += 1
        items = [
            {**item, "_instance": f"s{lap}-{item['_instance']}"}
            for item in bench.items[(sent % len(bench.items)) :][:chunk]
        ]
        await produce_items(bench.bootstrap, topic, items, rate)
        sent += len(items)
    return sent


def markdown(result: SoakResult, command: str) -> str:
    lines = [
        f"Command: `{command}`",
        "",
        f"{result.produced:,} items produced at {result.rate:.0f} items/s over "
        f"{result.seconds:.0f} s; {result.done:,} done.",
        "",
        "| at s | items done | items/s (last 10 s) | RSS MB |",
        "|---:|---:|---:|---:|",
    ]
    step = max(1, len(result.samples) // 20)
    shown = result.samples[::step]
    if result.samples and shown[-1] is not result.samples[-1]:
        shown.append(result.samples[-1])
    lines += [
        f"| {s.at_s:.0f} | {s.done:,} | {s.items_per_s:.1f} | {s.rss_mb:.1f} |" for s in shown
    ]
    if result.samples:
        first, last = result.samples[0], result.samples[-1]
        lines += [
            "",
            f"RSS at start {first.rss_mb:.1f} MB, at end {last.rss_mb:.1f} MB; mean of the last "
            f"third minus the first third (after the first minute): {result.growth_mb:+.1f} MB "
            f"while {last.done - first.done:,} items were processed.",
        ]
    return "\n".join(lines) + "\n"


def plot(result: SoakResult, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4))
    xs = [s.at_s for s in result.samples]
    ax.plot(xs, [s.rss_mb for s in result.samples], color="#3b6ea5", label="RSS MB")
    ax.set_xlabel("seconds")
    ax.set_ylabel("processor RSS (MB)")
    ax.set_ylim(bottom=0)
    ax2 = ax.twinx()
    ax2.plot(xs, [s.items_per_s for s in result.samples], color="#e1a43b", label="items/s")
    ax2.set_ylabel("items/s (orange)")
    ax2.set_ylim(bottom=0)
    ax.set_title("Soak: memory and throughput over time")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
