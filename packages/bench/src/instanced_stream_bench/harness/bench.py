"""`stream bench`: how much cheaper and faster than one call per item, in one run.

A broker (or the configured one) and the LLM simulator as its own process, shaped like
a real account (latency per request and per output token, concurrency and tokens-per-
minute limits); on the same machine, in the same run:

- the per-item baseline every peer product uses (window 1, same in-flight ceiling);
- this product at windows 10, 25, 50, 100;
- both delivery modes at window 50, LLM-bound and with an instant simulator (the
  machine's limit, against a raw aiokafka passthrough; medians of alternating runs);
- with `--scaling`: 1 and 2 processor processes on 1, 4 and 16 partitions;
- with `--duplicates`: what answering duplicates once saves (harness/duplicates.py).

Each product run drains a backlog loaded while its processors are held stopped, then a
paced phase at half its throughput measures produce-to-activity latency (docs/performance.md).
"""

from __future__ import annotations

import contextlib
import secrets
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import orjson
import yaml
from instanced_stream.core.spec import ModelEndpoint, load_spec
from instanced_stream.kafka.topics import activity_topics, ensure_product_topics
from instanced_stream.observe.progress import Progress
from instanced_stream.settings import DEFAULT_SPEC, Settings

from instanced_stream_bench.harness.demo import ProcessorProcess
from instanced_stream_bench.harness.duplicates import duplicate_runs
from instanced_stream_bench.harness.figures import llm_figures
from instanced_stream_bench.harness.load import (
    Tally,
    all_ready,
    bench_items,
    cpu_s,
    passthrough_row,
    produce_items,
    rss_mb,
)
from instanced_stream_bench.harness.report import Endpoint, Result, median_run
from instanced_stream_bench.harness.spec_variants import over_minimum
from instanced_stream_bench.harness.target import SimProcess, Target, llm_target, processor_usage
from instanced_stream_bench.testing.broker import free_port
from instanced_stream_bench.testing.sim.server import MODEL_NAME

__all__ = ["Bench", "bench_session", "bench_spec", "results_json", "run_bench"]


# Records of the rows that measure the machine (the passthrough, the instant endpoint)
# whatever --items says: a pass over a few thousand lasted a fraction of a second.
MACHINE_ITEMS = 20_000


@dataclass(slots=True)
class Bench:
    bootstrap: str
    sim: SimProcess | None  # None: a real endpoint (`target`), counted by the processors
    target: Target
    workdir: Path
    spec: dict[str, Any]
    items: list[dict[str, str]]
    endpoint: Endpoint
    cap_s: float
    paced_s: float
    results: list[Result] = field(default_factory=list)
    n: int = 0  # items of an LLM-bound run (`items` may hold more: see MACHINE_ITEMS)
    progress: Progress = field(default_factory=lambda: Progress("bench", None, unit="runs"))

    def _spec_file(
        self, window: int, in_flight: int, model: dict[str, Any], base: dict[str, Any]
    ) -> Path:
        spec = {**base, "window": {**base.get("window", {})}}
        spec["model"] = {**base.get("model", {}), **model}
        spec["quality"] = spec["model"].pop("quality", base.get("quality", {}))
        # Off unless a run asks (windows measured alone; harness/duplicates.py compares).
        spec["dedupe"] = spec["model"].pop("dedupe", {"enabled": False})
        spec["window"].update(max_items=window, max_in_flight=in_flight, max_wait_ms=100)
        if spec["model"].get("tier") == "batch":  # a short turnaround: the simulator's
            spec["batch"] = {"flush_s": 1.0, "poll_s": 0.5, "max_requests": 1000}
        path = self.workdir / f"agent-w{window}-f{in_flight}-{secrets.token_hex(2)}.yaml"
        path.write_text(yaml.safe_dump(spec, sort_keys=False))
        return path

    async def deploy(
        self,
        window: int,
        in_flight: int,
        partitions: int,
        processes: int,
        model: dict[str, Any] | None = None,
        delivery: str = "exactly_once",
        spec: dict[str, Any] | None = None,
    ) -> tuple[Settings, list[str], list[ProcessorProcess]]:
        """Fresh topics and `processes` processors (not started); `model`: spec overrides;
        `spec`: another spec than the bench's (a variant: harness/spec_variants.py)."""
        spec_path = self._spec_file(window, in_flight, model or {}, spec or self.spec)
        prefix = f"bench-{secrets.token_hex(3)}."
        run_dir = Path(tempfile.mkdtemp(prefix="run-", dir=self.workdir))
        settings = Settings(
            bootstrap_servers=self.bootstrap,
            topic_prefix=prefix,
            partitions=partitions,
            spec=spec_path,
            data_dir=run_dir / "data",
        )
        loaded = load_spec(spec_path)
        await ensure_product_topics(self.bootstrap, settings, loaded)
        outcome_topics = settings.topics.outcome_topics([])
        outcome_topics = [*activity_topics(settings, loaded), *outcome_topics]
        procs = [
            ProcessorProcess(
                {
                    "STREAM_BOOTSTRAP_SERVERS": self.bootstrap,
                    "STREAM_TOPIC_PREFIX": prefix,
                    "STREAM_PARTITIONS": str(partitions),
                    "STREAM_LLM_BASE_URL": self.target.url,
                    "STREAM_LLM_MODEL": self.target.model,
                    "STREAM_SPEC": str(spec_path),
                    "STREAM_DATA_DIR": str(run_dir / f"data{k}"),
                    "STREAM_WEB_PORT": str(free_port()),
                    "STREAM_LOG_LEVEL": "WARNING",
                    "STREAM_DELIVERY": delivery,
                },
                run_dir / f"processor{k}.log",
            )
            for k in range(processes)
        ]
        return settings, outcome_topics, procs

    async def product(
        self,
        name: str,
        window: int,
        *,
        processes: int = 1,
        partitions: int = 4,
        in_flight: int = 16,
        endpoint: Endpoint | None = None,
        items: int | None = None,
        paced: bool = True,
        model: dict[str, Any] | None = None,
        delivery: str = "exactly_once",
        spec: dict[str, Any] | None = None,
    ) -> Result:
        endpoint = endpoint or self.endpoint
        if self.sim is not None:
            await self.sim.configure(endpoint.config())
        settings, outcome_topics, procs = await self.deploy(
            window, in_flight, partitions, processes, model, delivery, spec
        )
        load = self.items[: items or self.n or len(self.items)]
        result = Result(name, window, processes, partitions, len(load), 0.0, 0.0)
        result.delivery = delivery
        result.tier = (model or {}).get("tier", "online")
        try:
            async with Tally(self.bootstrap, outcome_topics) as tally:
                await self._warm_up(tally, settings, procs, load[0])
                result.rss_start_mb = rss_mb(procs[0].proc.pid) if procs[0].proc else None
                before = await self._usage(procs)
                cpu_before = _cpu(procs)
                tally.restart()
                # A backlog, as the passthrough drains one: loading it must not share
                # the cores with the drain it measures.
                with contextlib.ExitStack() as held:
                    for proc in procs:
                        held.enter_context(proc.held())
                    await produce_items(self.bootstrap, settings.topics.input, load)
                result.capped = await tally.wait_for(tally.base + len(load), self.cap_s, procs)
                after = await self._usage(procs)
                cpu_after = _cpu(procs)
                assert tally.first_at is not None
                result.seconds = max(tally.last_at - tally.first_at, 1e-6)
                result.items = len(tally.done) - tally.base
                result.items_per_s = tally.rate()
                priced = (spec or self.spec).get("model", {})
                prices = ModelEndpoint.model_validate(
                    {k: v for k, v in priced.items() if k.startswith("price_") or k == "cache"}
                )
                real = self.sim is None  # a real endpoint: its slots make the ceiling
                slots = (self.target.slots or in_flight * processes) if real else None
                llm_figures(result, before, after, endpoint, in_flight * processes, prices, slots)
                if cpu_before is not None and cpu_after is not None and result.items:
                    result.cpu_ms_per_item = 1000 * (cpu_after - cpu_before) / result.items
                result.rss_end_mb = rss_mb(procs[0].proc.pid) if procs[0].proc else None
        finally:
            for proc in procs:
                proc.stop()
        if paced and self.paced_s > 0 and result.items_per_s > 0:
            # On fresh topics and processors: the drain's backlog must not queue ahead.
            settings, outcome_topics, procs = await self.deploy(
                window, in_flight, partitions, processes, model, delivery, spec
            )
            try:
                async with Tally(self.bootstrap, outcome_topics) as tally:
                    await self._warm_up(tally, settings, procs, load[0])
                    rate = 0.5 * result.items_per_s
                    await self._paced(result, tally, settings.topics.input, rate)
            finally:
                for proc in procs:
                    proc.stop()
        self.results.append(result)
        self.progress.finished(_line(result))
        return result

    async def _usage(self, procs: list[ProcessorProcess]) -> dict[str, float]:
        if self.sim is not None:
            return await self.sim.stats()
        return await processor_usage(int(p.env["STREAM_WEB_PORT"]) for p in procs)

    async def _warm_up(
        self,
        tally: Tally,
        settings: Settings,
        procs: list[ProcessorProcess],
        item: dict[str, str],
    ) -> None:
        """Starts the processors and waits for one answer: the clock runs after that."""
        for proc in procs:
            proc.start()
        warm = {**item, "_instance": "warm-up"}
        await produce_items(self.bootstrap, settings.topics.input, [warm])
        await tally.wait_for(1, 180, procs)
        await all_ready(procs)

    async def _paced(self, result: Result, tally: Tally, topic: str, rate: float) -> None:
        """Latency as a user at steady load sees it: items at a rate well within capacity."""
        count = max(20, min(int(rate * self.paced_s), 3000))
        extra = [{**item, "_instance": f"p-{item['_instance']}"} for item in self.items[:count]]
        seen = set(tally.latency_ms)
        target = len(tally.done) + len(extra)
        started = time.monotonic()
        await produce_items(self.bootstrap, topic, extra, rate)
        if await tally.wait_for(target, self.cap_s + self.paced_s, [], since=started):
            result.notes.append("paced phase did not finish in time")
        lat = sorted(v for k, v in tally.latency_ms.items() if k not in seen)
        if lat:
            result.p50_ms = lat[len(lat) // 2]
            result.p99_ms = lat[min(len(lat) - 1, int(len(lat) * 0.99))]
        result.notes.append(f"latency measured at {rate:.1f} items/s")

    async def passthrough(self, partitions: int = 4, runs: int = 3) -> Result:
        """The machine's ceiling: consume each record and produce it on, acks=all; the
        median of `runs` passes (one lasts under a second and scatters threefold)."""
        result = await passthrough_row(self.bootstrap, self.items, partitions, runs)
        self.results.append(result)
        self.progress.finished(_line(result))
        return result


def _cpu(procs: list[ProcessorProcess]) -> float | None:
    """The processors' CPU seconds so far: their own overhead, whatever else the machine
    runs (the broker, the simulator and this process share its cores)."""
    found = [cpu_s(p.proc.pid) if p.proc else None for p in procs]
    return None if None in found else sum(c for c in found if c is not None)


def _line(r: Result) -> str:
    return f"{r.name}: {r.items} items, {r.items_per_s:.1f} items/s" + (
        f", {r.requests_per_item:.4f} requests/item" if r.requests_per_item is not None else ""
    )


def bench_spec(path: Path = DEFAULT_SPEC) -> dict[str, Any]:
    """The example's spec, one decision per item (advisors multiply answers' tokens)."""
    spec: dict[str, Any] = yaml.safe_load(path.read_bytes())
    spec.pop("advisors", None)
    spec.pop("advice", None)
    return spec


@contextlib.asynccontextmanager
async def bench_session(
    bootstrap: str,
    endpoint: Endpoint,
    n: int,
    cap_s: float,
    paced_s: float,
    spec: dict[str, Any],
    llm: str = "simulator",
    model: str | None = None,
    machine_items: int = MACHINE_ITEMS,
) -> AsyncIterator[Bench]:
    """The simulator as its own process (so its work does not share our GIL), or the
    real model `llm` names (see instanced_stream_bench.harness.target)."""
    items = bench_items(max(n, machine_items))
    with tempfile.TemporaryDirectory(prefix="stream-bench-") as tmp:
        workdir = Path(tmp)
        bench = partial(
            Bench,
            bootstrap,
            workdir=workdir,
            spec=spec,
            items=items,
            endpoint=endpoint,
            cap_s=cap_s,
            paced_s=paced_s,
            n=n,
        )
        if llm != "simulator":
            with llm_target(llm, model=model) as target:
                yield bench(None, target)
            return
        sim = SimProcess(workdir)
        sim.start()
        try:
            await sim.ready()
            yield bench(sim, Target("simulator", f"{sim.url}/v1", MODEL_NAME))
        finally:
            sim.stop()


async def run_bench(
    bootstrap: str,
    *,
    items: int = 20_000,
    partitions: int = 4,
    windows: tuple[int, ...] = (10, 25, 50, 100),
    endpoint: Endpoint | None = None,
    cap_s: float = 60.0,
    paced_s: float = 10.0,
    scaling: bool = False,
    spec: dict[str, Any] | None = None,
    llm: str = "simulator",
    model: str | None = None,
    variants: tuple[str, ...] = (),
    machine_items: int = MACHINE_ITEMS,
    tier: str = "online",
    machine_rounds: int = 3,
    duplicates: float = 0.0,
    advised: dict[str, Any] | None = None,
) -> list[Result]:
    """`tier` batch: the baseline, then each window online and in the batch tier, side
    by side (cost per item is the point; docs/batch.md). `variants`: settings such as
    "reasoning=off" or "quality.shadow_rate=0.02", each run at the largest window besides
    the spec's own (what each setting costs). `advised`: the spec with its advisors, run
    at window 1 and the largest window beside the example with its shared prefix over
    the 1,024-token cache minimum (harness/spec_variants.py)."""
    endpoint = endpoint or Endpoint()
    # The prefix variant writes the example's own rules out: for the example only.
    example = spec is None
    spec = spec if spec is not None else bench_spec()
    session = bench_session(
        bootstrap, endpoint, items, cap_s, paced_s, spec, llm, model, machine_items
    )
    async with session as bench:
        if duplicates:  # only the runs that show what answering them once saves
            return await duplicate_runs(bench, endpoint, max(windows), duplicates, partitions)
        if tier == "batch":
            await _tiers(bench, windows, endpoint, partitions, variants)
            return bench.results
        await bench.passthrough(partitions)
        # The AIMD ceiling: it finds the account's limit.
        in_flight = endpoint.concurrency * 2 if bench.sim else 2 * (bench.target.slots or 4)
        await bench.product("baseline (window 1)", 1, in_flight=in_flight, partitions=partitions)
        for window in windows:
            await bench.product(
                f"window {window}", window, in_flight=in_flight, partitions=partitions
            )
        # Both delivery modes (docs/architecture.md): LLM-bound, then at the machine's limit.
        await bench.product(
            "window 50, at least once",
            50,
            in_flight=in_flight,
            partitions=partitions,
            delivery="at_least_once",
        )
        grown = over_minimum(spec) if example else None
        await _variants(bench, grown, advised, max(windows), in_flight, partitions)
        if bench.sim is not None:
            await _at_the_limit(bench, machine_rounds)
        for variant in variants:
            key, _, value = variant.partition("=")
            section, _, name = key.partition(".")
            shadow = section == "quality"  # e.g. quality.shadow_rate=0.02
            await bench.product(
                f"window {max(windows)}, {key} {value}",
                max(windows),
                in_flight=in_flight,
                partitions=partitions,
                model={"quality": {name: value}} if shadow else {key: value},
            )
            if grown is not None and not shadow:
                # The case issue 55's 0.1x target is about, under the same setting on
                # both sides: the baseline pays the setting's answer too.
                await _variant_over_minimum(
                    bench, grown, variant, max(windows), in_flight, partitions
                )
        if scaling:
            # LLM-bound per worker (4 in flight each), the account roomy enough for two.
            roomy = Endpoint(
                endpoint.latency_ms,
                endpoint.per_output_token_ms,
                concurrency=64,
                tokens_per_minute=endpoint.tokens_per_minute * 8,
            )
            for parts in (1, 4, 16):
                for procs in (1, 2):
                    await bench.product(
                        f"scaling: {procs} process(es), {parts} partition(s)",
                        25,
                        processes=procs,
                        partitions=parts,
                        in_flight=4,
                        endpoint=roomy,
                        items=min(items, 4000),
                        paced=False,
                    )
        return bench.results


async def _variants(
    bench: Bench,
    grown: dict[str, Any] | None,
    advised: dict[str, Any] | None,
    window: int,
    in_flight: int,
    partitions: int,
) -> None:
    """The baseline and the largest window of each spec variant: the spec with its
    advisors, and (`grown`) the example with its shared prefix just over the cache
    minimum. Unpaced: their point is the bill, not latency."""
    variants = []
    if advised is not None and advised.get("advisors"):
        variants.append((", advisors", advised))
    if grown is not None:
        variants.append((", prefix over 1,024", grown))
    for label, variant in variants:
        run = partial(
            bench.product, in_flight=in_flight, partitions=partitions, paced=False, spec=variant
        )
        await run(f"baseline (window 1){label}", 1)
        await run(f"window {window}{label}", window)


async def _variant_over_minimum(
    bench: Bench,
    grown: dict[str, Any],
    variant: str,
    window: int,
    in_flight: int,
    partitions: int,
) -> None:
    """A model setting (`variant`, NAME=VALUE) on the example with its shared prefix over
    the cache minimum: its own baseline, and the largest window."""
    key, _, value = variant.partition("=")
    run = partial(
        bench.product,
        in_flight=in_flight,
        partitions=partitions,
        paced=False,
        spec=grown,
        model={key: value},
    )
    await run(f"baseline (window 1), {key} {value}, prefix over 1,024", 1)
    await run(f"window {window}, {key} {value}, prefix over 1,024", window)


async def _at_the_limit(bench: Bench, rounds: int) -> None:
    """Both modes on the instant simulator in alternating rounds (runs scatter, and a cold
    broker's first pays its warm-up); of the rows they add, each mode's median is kept."""
    suffix = {"at_least_once": ", at least once", "exactly_once": ""}
    runs: dict[str, list[Result]] = {mode: [] for mode in suffix}
    one = partial(bench.product, window=50, endpoint=Endpoint(instant=True), items=len(bench.items))
    added = len(bench.results)
    for k in range(rounds):
        for mode in sorted(suffix, reverse=k % 2 == 1):
            name = f"instant simulator, window 50{suffix[mode]}"
            runs[mode].append(await one(name, delivery=mode))
    bench.results[added:] = [median_run(results) for results in runs.values()]


async def _tiers(
    bench: Bench,
    windows: tuple[int, ...],
    endpoint: Endpoint,
    partitions: int,
    variants: tuple[str, ...],
) -> None:
    in_flight = endpoint.concurrency * 2 if bench.sim else 2 * (bench.target.slots or 4)
    # On the units (the batch tier's runtime) throughout, so the rows differ in the tier.
    run = partial(
        bench.product, in_flight=in_flight, partitions=partitions, delivery="exactly_once"
    )
    await run("baseline (window 1)", 1)
    for window in windows:
        await run(f"window {window}", window)
        # Unpaced: its latency is the Batch API's turnaround (up to 24 h), not ours.
        batch = await run(
            f"window {window}, batch tier", window, model={"tier": "batch"}, paced=False
        )
        batch.notes.append(
            "items/s is the simulator's batch turnaround (about a second); "
            "a provider's is minutes to 24 h"
        )
    for variant in variants:  # each setting in both tiers, at the largest window
        key, _, value = variant.partition("=")
        window = max(windows)
        await run(f"window {window}, {key} {value}", window, model={key: value}, paced=False)
        await run(
            f"window {window}, batch tier, {key} {value}",
            window,
            model={"tier": "batch", key: value},
            paced=False,
        )


def results_json(results: list[Result]) -> bytes:
    return orjson.dumps([asdict(r) for r in results], option=orjson.OPT_INDENT_2)
