"""`stream demo`: the whole product on embedded defaults, in one command.

A local Kafka broker (or the configured one), a model (the LLM simulator by default; a
real local model with `--llm local`; any endpoint with `--llm URL`), the processor as
its own OS process, and the example's activity worker; it publishes sample comments plus
a few malformed records, waits until every item is accounted for, and reports.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import orjson
from aiokafka import AIOKafkaProducer
from instanced_stream.activities.worker import Activities, load_activities
from instanced_stream.core.spec import AgentSpec, load_spec
from instanced_stream.errors import StreamError
from instanced_stream.kafka.security import options_for
from instanced_stream.kafka.topics import activity_topics, ensure_product_topics, read_json
from instanced_stream.ops.audit import AuditReport, audit
from instanced_stream.ops.workflow_audit import audit_workflows
from instanced_stream.settings import DEFAULT_SPEC, EXAMPLES, Settings

from instanced_stream_bench.harness.chaos import Chaos
from instanced_stream_bench.harness.target import (
    Target,
    llm_target,
    processor_live,
    processor_usage,
)
from instanced_stream_bench.harness.warm_start import Running, enabled, fork_processor
from instanced_stream_bench.testing.broker import die_with_parent, free_port, kafka_bootstrap
from instanced_stream_bench.testing.samples import comments, malformed_records, tickets
from instanced_stream_bench.testing.sim.server import SimConfig

_T = TypeVar("_T")

__all__ = [
    "NotAccounted",
    "ProcessorProcess",
    "launch_processor",
    "produce",
    "report_when_accounted",
    "run_demo",
    "until_signalled",
    "wait_accounted",
]


class ProcessorProcess:
    """`stream process` as a real OS process (so tests can kill -9 it)."""

    def __init__(self, env: dict[str, str], log_path: Path) -> None:
        # A free page port unless one is named: the default (6066) may be any other
        # processor's on this host, and a test must never need a fixed port free.
        self.env = {"STREAM_WEB_PORT": "0", **os.environ, **env}
        self.log_path = log_path
        self.proc: Running | None = None

    def start(self) -> None:
        if enabled(self.env):
            self.proc = fork_processor(self.env, self.log_path)
            return
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "instanced_stream", "process"],
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=die_with_parent,  # never left under init, however this one ends
        )
        log.close()

    def stop(self, timeout: float = 20) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """Stopped (SIGSTOP) meanwhile, then continued: a benchmark loads its backlog
        without the processor consuming it record by record as it arrives. Well under
        the session timeout, the group does not notice."""
        assert self.proc is not None
        _signal_group(self.proc.pid, signal.SIGSTOP)
        try:
            yield
        finally:
            _signal_group(self.proc.pid, signal.SIGCONT)

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            _signal_group(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no processor log)"


def _signal_group(pid: int, sig: int) -> None:
    """The processor's whole process group; a forked one that has not yet made its group
    (it does so first thing) by its pid alone."""
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        os.kill(pid, sig)


async def produce(bootstrap: str, topic: str, records: list[tuple[bytes | None, bytes]]) -> int:
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        **options_for(bootstrap),
        acks="all",
        linger_ms=5,
        max_request_size=8 * 1024 * 1024,
    )
    try:
        # started inside: a Ctrl-C during the start still stops it (else "Unclosed")
        await producer.start()
        futures = [await producer.send(topic, value, key=key) for key, value in records]
        await asyncio.gather(*futures)
    finally:
        await producer.stop()
    return len(records)


class NotAccounted(StreamError):
    """`wait_accounted` timed out: not every expected input has its outcome. Carries the
    last report, for a caller that shows it instead (the demo's summary)."""

    def __init__(self, report: AuditReport, expected: int, wait_s: float) -> None:
        super().__init__(
            f"after {wait_s:g} s, {report.inputs} of {expected} inputs seen and "
            f"{report.unaccounted} without an outcome: {report.summary()}; missing "
            f"{report.missing[:10]}"
        )
        self.report = report


async def wait_accounted(
    bootstrap: str,
    settings: Settings,
    spec: AgentSpec,
    expected: int,
    wait_s: float,
    proc: ProcessorProcess | None = None,
) -> AuditReport:
    """The audit once `expected` inputs are all accounted for; raises NotAccounted when
    `wait_s` passes first (a caller that forgot to look at the report cannot pass)."""
    deadline = time.monotonic() + wait_s
    while True:
        report = await audit(bootstrap, settings.topics, activity_topics(settings, spec))
        if report.inputs >= expected and report.unaccounted == 0:
            return report
        if time.monotonic() > deadline:
            raise NotAccounted(report, expected, wait_s)
        if proc and proc.proc and proc.proc.poll() is not None:
            raise RuntimeError(f"processor exited ({proc.proc.returncode}):\n{proc.tail()}")
        await asyncio.sleep(1.0)


async def report_when_accounted(
    bootstrap: str,
    settings: Settings,
    spec: AgentSpec,
    expected: int,
    wait_s: float,
    proc: ProcessorProcess | None = None,
) -> AuditReport:
    """`wait_accounted`, but the last report on a timeout: for summaries that show what
    was missing (the demo, the seeds) rather than stop."""
    try:
        return await wait_accounted(bootstrap, settings, spec, expected, wait_s, proc)
    except NotAccounted as exc:
        return exc.report


async def launch_processor(
    bootstrap: str,
    llm_url: str,
    prefix: str,
    tmp_prefix: str,
    spec_path: Path | None = None,
    **env: str,
) -> tuple[Settings, AgentSpec, ProcessorProcess]:
    """Creates a fresh set of topics (by prefix) and starts a processor process on them."""
    workdir = Path(tempfile.mkdtemp(prefix=tmp_prefix))
    settings = Settings(
        bootstrap_servers=bootstrap,
        topic_prefix=prefix,
        llm_base_url=llm_url,
        data_dir=workdir / "data",
        spec=spec_path or DEFAULT_SPEC,
    )
    spec = load_spec(settings.spec)
    await ensure_product_topics(bootstrap, settings, spec)
    proc = ProcessorProcess(
        {
            "STREAM_BOOTSTRAP_SERVERS": bootstrap,
            "STREAM_TOPIC_PREFIX": prefix,
            "STREAM_LLM_BASE_URL": llm_url,
            "STREAM_DATA_DIR": str(workdir / "data"),
            "STREAM_SPEC": str(settings.spec),
            **env,
        },
        workdir / "processor.log",
    )
    proc.start()
    return settings, spec, proc


async def _wait_done(bootstrap: str, settings: Settings, expected: int, wait_s: float) -> int:
    """Stateful examples: waits until that many workflows published their final state."""
    deadline = time.monotonic() + wait_s
    while True:
        done = len({d["instance"] for d in await read_json(bootstrap, settings.topics.done)})
        if done >= expected or time.monotonic() > deadline:
            return done
        await asyncio.sleep(1.0)


async def _closed(worker: asyncio.Task[None], bound_s: float = 10.0) -> None:
    """Waits for the activity worker, told to stop, to close its clients. A Ctrl-C
    cancels the demo again each second while it stops (`until_signalled`): awaiting the
    worker directly passed that cancellation on to it, mid-close, and its consumer and
    producer were reported `Unclosed`. Here the worker is only waited for (bounded), never
    cancelled; a cancellation meanwhile is taken up again by the next one."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + bound_s
    while not worker.done() and loop.time() < deadline:
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait({worker}, timeout=deadline - loop.time())
    if worker.done() and not worker.cancelled():
        worker.exception()  # retrieved: what the worker ended with was its own business
    else:
        worker.cancel()


async def _demo(
    bootstrap: str,
    target: Target,
    n: int,
    wait_s: float,
    say: Any,
    example: str,
    chaos: int = 0,
) -> dict[str, Any]:
    web_port = free_port()
    settings, spec, proc = await launch_processor(
        bootstrap,
        target.url,
        f"demo-{secrets.token_hex(3)}.",
        "stream-demo-",
        spec_path=EXAMPLES / example / "agent.yaml",
        STREAM_LLM_MODEL=target.model,
        STREAM_WEB_PORT=str(web_port),
        # A 135M model on two CPU cores writes ~30 tokens/s: a window of the example takes
        # minutes, not the seconds its spec allows a hosted model.
        **({"STREAM_LLM_TIMEOUT_S": "300"} if target.kind == "local" else {}),
        # Under chaos the group must notice a killed member soon, not after 15 s; and
        # chaos shows exactly once, whatever the default delivery is.
        **({"STREAM_SESSION_TIMEOUT_S": "6", "STREAM_DELIVERY": "exactly_once"} if chaos else {}),
    )
    procs = [proc]
    if chaos:  # a second processor of the same group: kills and restarts rebalance
        second = ProcessorProcess(
            {**proc.env, "STREAM_WEB_PORT": str(free_port())},
            proc.log_path.with_name("processor-2.log"),
        )
        second.start()
        procs.append(second)
    prefix = settings.topic_prefix
    activities: Activities = load_activities(str(EXAMPLES / example / "activities.py"))
    stop = asyncio.Event()
    worker = asyncio.create_task(activities.run(settings, spec, bootstrap, stop))
    started = time.monotonic()
    try:
        bad = malformed_records(settings.max_record_bytes) if n >= 10 else []
        good = tickets(n - len(bad)) if example == "tickets" else comments(n - len(bad))
        records: list[tuple[bytes | None, bytes]] = [
            (c["_instance"].encode(), orjson.dumps(c)) for c in good
        ]
        for i, (key, value, _) in enumerate(bad):
            records.insert((i + 1) * len(records) // (len(bad) + 1), (key, value))
        say(f"publishing {n} items ({len(bad)} malformed on purpose) to {settings.topics.input}")
        monkey = Chaos(list(procs), chaos, say)
        monkey_task = asyncio.create_task(monkey.run()) if chaos else None
        # Under chaos the items come in waves, one per kill, so kills find work in flight.
        waves = chaos + 1 if chaos else 1
        for wave in range(waves):
            if wave:
                await asyncio.sleep(monkey.between_s[0])
            part = records[wave * len(records) // waves : (wave + 1) * len(records) // waves]
            await produce(bootstrap, settings.topics.input, part)
        if monkey_task is not None:
            await monkey_task  # every kill done before the outcomes are counted
        report = await report_when_accounted(bootstrap, settings, spec, n, wait_s, proc)
        if spec.plan is not None:
            await _wait_done(bootstrap, settings, n - len(bad), wait_s)
            report = await report_when_accounted(bootstrap, settings, spec, n, 10, proc)
        expected_calls = sum(report.calls_by_tool.values())
        deadline = time.monotonic() + 30
        while activities.handled + activities.duplicates < expected_calls:
            if time.monotonic() > deadline:
                break
            await asyncio.sleep(0.2)
        elapsed = time.monotonic() - started
        usage = (
            {k: float(v) for k, v in target.sim.stats.items()}
            if target.sim is not None
            else await processor_usage([web_port])
        )
        quality = await _quality(web_port)
    finally:
        stop.set()
        for each in procs:
            each.stop()
        await _closed(worker)
    if report.unaccounted:
        say(f"processor log (last lines):\n{proc.tail()}")
    letters = await read_json(bootstrap, settings.topics.dead_letter)
    advice = await read_json(bootstrap, settings.topics.advice) if spec.advisors else []
    done = await read_json(bootstrap, settings.topics.done)
    awaited = 0
    for topic in activity_topics(settings, spec):
        awaited += sum(
            "_outputPath" in r.get("call", {}) for r in await read_json(bootstrap, topic)
        )
    return {
        "items": n,
        "llm_requests": int(usage.get("requests", 0)),
        "llm_requests_per_item": round(usage.get("requests", 0) / max(n, 1), 4),
        "calls": report.calls_by_tool,
        "fire_and_forget": report.fire_and_forget,
        "no_action": report.no_action,
        "dead_letters": report.item_dead_letters,
        "dead_letter_codes": report.dead_letters,
        "dead_letter_samples": _samples(letters),
        "unaccounted": report.unaccounted,
        "duplicate_calls": report.duplicate_calls,
        "reviewed": report.reviewed,
        "advice_records": len(advice),
        "advisor_opinions": sum(len(a["opinions"]) for a in advice),
        "malformed_votes": sum(1 for a in advice for o in a["opinions"] if o.get("error")),
        "consults": sum(len(a.get("consulted", [])) for a in advice),
        "divergent": sum(1 for a in advice if a["divergent"]),
        "activity_handled": activities.handled,
        "example": example,
        "done": len({d["instance"] for d in done}),
        "turns": sum(d["turns"] for d in done),
        "awaited_calls": awaited,
        "results_answered": activities.answered,
        "prompt_tokens": int(usage.get("prompt_tokens", 0)),
        "completion_tokens": int(usage.get("completion_tokens", 0)),
        "cached_tokens": int(usage.get("cached_tokens", 0)),
        # At the spec's prices, cached prompt tokens at the cached price.
        "cost_per_item_usd": spec.model.cost_usd(
            int(usage.get("prompt_tokens", 0)),
            int(usage.get("completion_tokens", 0)),
            int(usage.get("cached_tokens", 0)),
        )
        / max(n, 1),
        "window_max_items": spec.window.max_items,
        "quality": quality,
        "elapsed_s": round(elapsed, 2),
        "audit": report.summary(),
        "topics_prefix": prefix,
        "llm": target.summary(),
        **({"chaos": monkey.summary(), "exactly_once": _exactly_once(report)} if chaos else {}),
        **(await _workflows(bootstrap, settings) if spec.plan else {}),
    }


async def _quality(port: int) -> dict[str, Any]:
    """The shadow sample's figures (quality.*): how many items were asked alone, their
    decisions' agreement with the batched ones, the window the controller keeps now."""
    try:
        live = (await processor_live(port)).get("quality", {})
    except (OSError, aiohttp.ClientError, ValueError) as exc:
        return {"error": f"the processor's page did not answer: {exc}"}
    keep = ("shadowed", "compared", "agreement", "window_now", "buckets", "shadow_cost_usd")
    return {k: live.get(k) for k in keep} | {"changes": live.get("changes", [])[-5:]}


def _exactly_once(report: AuditReport) -> dict[str, int]:
    """What a read_committed reader of every outcome topic found (`stream audit`)."""
    return {
        "outcomes_per_input_max": report.outcomes_per_input_max,
        "duplicate_call_ids": report.duplicate_calls,
        "missing": report.unaccounted,
    }


async def _workflows(bootstrap: str, settings: Settings) -> dict[str, Any]:
    summary = (await audit_workflows(bootstrap, settings)).summary()
    return {"workflows": summary, "workflows_unended": summary.get("pending", 0)}


async def until_signalled(work: Coroutine[Any, Any, _T]) -> _T:
    """`work`, until SIGINT or SIGTERM: then it is cancelled, and cancelled again each
    second while it runs on (a cancellation swallowed by a client library below once kept
    the demo waiting out its 600 s timeout after Ctrl-C), and the signal is raised as the
    CLI's SIGTERM handler would (termination.py) or as KeyboardInterrupt, so every
    `finally` and context manager above stops what it started."""
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(work)
    signalled: list[int] = []

    def on_signal(sig: int) -> None:
        signalled.append(sig)
        task.cancel()

    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    for sig in previous:
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        while not task.done():
            await asyncio.wait({task}, timeout=1.0)
            if signalled and not task.done():
                task.cancel()
    finally:
        for sig, handler in previous.items():
            loop.remove_signal_handler(sig)
            signal.signal(sig, handler)
    term = previous[signal.SIGTERM]
    if signalled and signalled[0] == signal.SIGTERM and callable(term):
        term(signal.SIGTERM, None)  # the CLI's: raises its Terminated (exit 143)
    if signalled:
        raise KeyboardInterrupt()
    return task.result()


def run_demo(
    items: int,
    as_json: bool,
    timeout: float | None = None,
    latency_ms: float = 50.0,
    example: str = "moderation",
    llm: str = "simulator",
    chaos: int = 0,
    settings: Settings | None = None,
) -> int:
    settings = settings or Settings()

    def say(msg: str) -> None:
        print(msg, file=sys.stderr if as_json else sys.stdout, flush=True)

    with (
        kafka_bootstrap(settings.bootstrap_servers) as bootstrap,
        llm_target(llm, SimConfig(latency_ms=latency_ms), settings.llm_model) as target,
    ):
        say(f"broker {bootstrap}; {target.describe()}")
        wait_s = timeout or (180.0 if target.kind == "simulator" else 900.0)
        demo = _demo(bootstrap, target, items, wait_s, say, example, chaos)
        result = asyncio.run(until_signalled(demo))
    if not as_json:
        calls = ", ".join(f"{k}={v}" for k, v in sorted(result["calls"].items()))
        print(
            f"\n{result['items']} items -> {result['llm_requests']} LLM requests "
            f"({result['llm_requests_per_item']} per item, window {result['window_max_items']})\n"
            f"calls published: {calls} "
            f"(fire-and-forget {result['fire_and_forget']}, awaited {result['awaited_calls']})\n"
            f"explicit no-action: {result['no_action']}\n"
            f"dead letters: {result['dead_letters']} {result['dead_letter_codes']}\n"
            + "".join(
                f"  - {d['code']}: {d['reason'][:90]}\n" for d in result["dead_letter_samples"]
            )
            + f"tokens: prompt {result['prompt_tokens']} (cached {result['cached_tokens']}), "
            f"completion {result['completion_tokens']}; "
            f"USD per item {result['cost_per_item_usd']:.3g} (cached tokens at their price)\n"
            f"advisors: {result['advisor_opinions']} opinions on {result['advice_records']} "
            f"instances, {result['consults']} consults, {result['divergent']} divergent, "
            f"{result['reviewed']} calls held for review\n"
            f"activity handler ran {result['activity_handled']} times\n"
            + (
                f"workflows done: {result['done']} in {result['turns']} turns, "
                f"{result['awaited_calls']} awaited calls answered by activities; plan steps "
                f"skipped on a branch not taken: {result['workflows']['skipped_branch']}, "
                f"run without their input: {result['workflows']['ran_on_missing_input']}\n"
                if result["done"]
                else ""
            )
            + (
                f"chaos: {result['chaos']['kills_done']} SIGKILLs at {result['chaos']['at_s']}s, "
                "each followed by a restart\n"
                if "chaos" in result
                else ""
            )
            + f"unaccounted: {result['unaccounted']}   elapsed: {result['elapsed_s']}s\n"
            f"audit: {result['audit']}"
        )
        if settings.bootstrap_servers:  # only the user's broker outlives the demo
            print(f"  (again: stream audit --topic-prefix {result['topics_prefix']})")
    else:
        print(orjson.dumps(result).decode())
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    return 0 if result["unaccounted"] == 0 else 1


def _samples(letters: list[dict[str, Any]], keep: int = 10) -> list[dict[str, Any]]:
    """Up to `keep` dead letters, each once: a redo after a crash repeats its letters."""
    seen: dict[str, dict[str, Any]] = {}
    for d in letters:
        sample = {"code": d.get("code"), "reason": d.get("reason"), "source": d.get("source")}
        seen.setdefault(orjson.dumps(sample, option=orjson.OPT_SORT_KEYS).decode(), sample)
    return list(seen.values())[:keep]
