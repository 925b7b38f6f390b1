"""The processor on units (docs/architecture.md, exactly once): membership, units and the stager,
assembled once (runtime/assembly.py) and run until SIGTERM or SIGINT.

The fetch loop hands input records to the intake task through a queue of one fetch at a
time, and holds the input partitions (consumer pause) while that queue is full, so an
LLM outage pauses consumption without stalling the group: the consumer keeps polling,
heartbeats and rebalances go on. Nothing here knows about transactions; the units do.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import mode
import orjson
from mode.utils.logging import cry

from instanced_stream import termination
from instanced_stream.core.instance import Instance
from instanced_stream.core.overrides import Messages
from instanced_stream.core.spec import AgentSpec
from instanced_stream.faultpoints import NO_PROBE, Probe, injector
from instanced_stream.kafka.fenced import quiet_fenced_transactions
from instanced_stream.llm.batch_api import BatchModel
from instanced_stream.llm.client import LLM
from instanced_stream.observe.telemetry import setup_tracing, shutdown_tracing
from instanced_stream.runtime.assembly import assemble
from instanced_stream.runtime.pipeline.dispatch import orphaned
from instanced_stream.runtime.state.store import Stores
from instanced_stream.runtime.units.fetcher import Fetched
from instanced_stream.runtime.units.unit import Unit, UnitGone, oldest_open_since
from instanced_stream.settings import Settings

__all__ = ["every", "run_processor", "run_until_signalled"]

log = logging.getLogger("stream.processor")


_FETCH_MS = 200
_FETCH_RECORDS = 2000
# Fetches queued for the intake before the input is held: a few, so the intake never
# waits for a fetch's round trip, and a hold (which drops what the client prefetched)
# happens only when the window really cannot take more (an LLM outage, a slow model).
_QUEUED_FETCHES = 4
_HELD_POLL_MS = 20  # while held: results and approvals still flow, heartbeats go on


class _Service(mode.Service):
    """The processor's loops on what `assemble` built: the fetch loop and the intake,
    the routing of results and approvals (`Routes`), the timers, readiness, the drain."""

    def __init__(
        self,
        settings: Settings,
        spec: AgentSpec,
        bootstrap: str,
        llm_url: str,
        overrides: tuple[Messages, dict[int, int]],
        probe: Probe,
    ) -> None:
        super().__init__()
        self.settings = settings
        self.bootstrap = bootstrap
        self.probe = probe
        self.fetching: asyncio.Future[None] | None = None
        built = assemble(settings, spec, bootstrap, llm_url, overrides, probe, self)
        self.metrics = built.metrics
        self.worker = built.worker
        self.live = built.pipeline.live
        self.flows = built.pipeline.flows
        self.answers = built.pipeline.answers
        self.stager = built.pipeline.stager
        self.llm = built.llm
        self.escalate_llm = built.second
        self.submissions = built.submissions
        self.journal = built.journal
        self.restores = built.restores
        self.lanes = built.lanes
        self.membership = built.membership
        self.fetcher = built.membership.fetcher  # the walk's first stage
        self.follower = built.follower
        self.web = built.web
        self.ideas = built.ideas
        self.turns: asyncio.Queue[tuple[Unit, Instance]] = asyncio.Queue()
        self.serving = False
        self.queue: asyncio.Queue[list[Fetched]] = asyncio.Queue(maxsize=_QUEUED_FETCHES)
        self.stopping = asyncio.Event()

    def ready_now(self) -> bool:
        m = self.membership
        return self.serving and m.stable() and not m.opening and not m.group()["storm"]

    def unit_of(self, partition: int) -> Unit | None:
        return self.membership.units.get(partition)

    async def opened(self, unit: Unit) -> None:
        """A stateful unit: its store restored before it takes work (outside the
        assignment callback: see Membership); the workflows that wait for a turn resume.
        The batch tier: the lines its partition submitted."""
        if self.journal is not None:  # before any redo of the partition is windowed
            found = await self.journal.restore(unit.partition)
            log.info("partition %d: %d journaled answers to reuse", unit.partition, found)
        if self.submissions is not None:
            lines = await self.submissions.restore(self.bootstrap, unit.partition)
            log.info("partition %d: %d submitted batch lines to poll", unit.partition, lines)
        if self.restores is not None:
            self.ready(unit, await self.restores.restore(unit))

    def closed(self, unit: Unit) -> None:
        self.lanes.drop(unit)
        for task in orphaned(self.stager.dispatch.tasks):
            task.cancel()  # its limiter slot is freed: no item of it is staged here
        if self.submissions is not None:
            self.submissions.drop(unit.partition)
        if self.journal is not None:
            self.journal.drop(unit.partition)
        if self.restores is not None:
            self.restores.keep(unit.partition)  # dropped from the owned stores

    def ready(self, unit: Unit, ready: list[Instance]) -> None:
        for inst in ready:
            self.turns.put_nowait((unit, inst))

    def reconfigure(self, spec: AgentSpec, refused: list[tuple[str, str]]) -> None:
        for key, reason in refused:
            log.error("context message %s refused: %s", key, reason)
        self.metrics.context_refused.set(len(refused))
        self.live.install(spec)  # refused (raises): the running spec stays as it was

    async def on_start(self) -> None:
        # The probes first: a member that cannot get into its group answers them (not
        # ready, and why) instead of leaving its port closed.
        try:
            await self.web.start()
        except OSError as exc:  # a busy port costs the page and probes, never the stream
            log.warning("web server not started on port %d: %s", self.web.port, exc)
        if self.journal is not None:  # before the first unit opens: it restores from it
            await self.journal.start()
        await self.membership.start()
        self.stager.start()
        if isinstance(self.llm, BatchModel):
            self.llm.start()
        await self.follower.start()
        if self.ideas is not None:
            self.ideas.start()

    async def on_started(self) -> None:
        self.serving = True
        log.info("processor %s started (delivery %s)", self.worker, self.settings.delivery)
        # Supervised by mode: a task that raises crashes the service, and the process
        # exits non-zero (a partition that keeps failing, an intake bug).
        self.fetching = self.add_future(self._fetch_loop())
        self.add_future(self._intake())
        self.add_future(self._next_turns())
        failed = functools.partial(self.metrics.count, {"timer_errors": 1})
        self.add_future(every(5.0, self._lag, failed))
        self.add_future(every(1.0, self._expire, failed))
        self.add_future(every(30.0, self._report, failed))
        if self.submissions is not None:
            self.add_future(
                every(5.0, functools.partial(self.submissions.sweep, self.stager.windower), failed)
            )

    async def on_stop(self) -> None:
        """SIGTERM or SIGINT (`run_until_signalled`): fetching stops, the batches in flight get
        `drain_s` to be staged and committed, then every unit commits and leaves."""
        self.stopping.set()
        self.membership.leaving()  # a rebalance while draining gives this member nothing
        if self.fetching is not None:
            await asyncio.gather(self.fetching, return_exceptions=True)
        self.serving = False
        left = await self.stager.drain(self.settings.drain_s)
        if left:
            log.warning("drain: %d batches still in flight; redone by the next owner", left)
        else:
            log.info("drain: every batch in flight was delivered")
        await self.stager.stop()
        await self.lanes.stop()
        await self.membership.stop()
        if self.journal is not None:
            await self.journal.stop()
        await self.follower.stop()
        await self.web.stop()
        if self.ideas is not None:
            await self.ideas.stop()
        await _closed(self.llm, self.escalate_llm, self.flows.stores if self.flows else None)

    async def _fetch_loop(self) -> None:
        while not self.stopping.is_set():
            await self.membership.heal()
            held = self.queue.full()
            self.fetcher.hold_input(held)
            fetched = await self.fetcher.fetch(_HELD_POLL_MS if held else _FETCH_MS, _FETCH_RECORDS)
            inputs: list[Fetched] = []
            for got in fetched:
                if got.record.topic == self.membership.input:
                    inputs.append(got)
                else:
                    self.lanes.put(got)  # applied by its partition's lane, in order
            if inputs:
                # Held before this fetch if the queue was full (only this loop fills it):
                # the put does not wait; a member that stops polling is put out.
                await self.queue.put(inputs)

    async def _intake(self) -> None:
        while True:
            chunk = await self.queue.get()
            for got in chunk:
                if self.stager.draining:
                    continue  # the next owner redoes it
                await self.stager.take(got.unit, got.record, got.slot)

    async def _next_turns(self) -> None:
        while True:
            unit, inst = await self.turns.get()
            if self.stager.draining:
                continue
            try:
                unit.check()
                await self.stager.offer_turn(unit, inst)
            except UnitGone:
                continue  # the partition's next unit offers the turn again

    async def _expire(self) -> None:
        if self.flows is None or self.membership.rebalancing:
            return
        for unit, inst in self.flows.expired(self.membership.units):
            self.turns.put_nowait((unit, inst))

    async def _lag(self) -> None:
        self.metrics.partitions.set(self.membership.states())
        self.metrics.partitions.set_group(self.membership.group(), self.membership.partitions())
        if self.flows is not None:
            self.metrics.partitions.set_held(*self.flows.stores.held())
        self.metrics.partitions.set_lag(await self.fetcher.lag())
        opened = [oldest_open_since(u) for u in self.membership.units.values()]
        oldest = min((at for at in opened if at is not None), default=None)
        ages = self.submissions.in_flight() if self.submissions is not None else None
        self.metrics.set_waiting(ages, None if oldest is None else time.monotonic() - oldest)

    async def _report(self) -> None:
        log.info(
            "stats %s open=%d in_flight=%d rebalances=%d",
            orjson.dumps(self.metrics.counts()).decode(),
            sum(u.open_slots() for u in self.membership.units.values()),
            len(self.stager.dispatch.tasks),
            self.membership.rebalances,
        )


async def _closed(*clients: LLM | BatchModel | Stores | None) -> None:
    for client in clients:
        if client is not None:
            await client.close()


async def every(
    seconds: float, step: Callable[[], Awaitable[Any]], failed: Callable[[], None] = lambda: None
) -> None:
    """A timer that survives its step's errors: logged, counted by `failed`, and tried
    again next time (a timer's exception once stopped the whole worker)."""
    while True:
        await asyncio.sleep(seconds)
        try:
            await step()
        except asyncio.CancelledError:
            raise
        except Exception:
            failed()
            log.exception("timer %s failed; it runs again in %.0fs", step.__name__, seconds)


@contextlib.contextmanager
def _signals(handlers: dict[signal.Signals, Callable[[], None]]) -> Iterator[None]:
    """`handlers` on the running loop for as long as the block runs; then the handlers
    that were there before, back (asyncio leaves the default: the CLI's would be lost).
    A SIGTERM that the CLI's deferred handler recorded before (`termination`) is acted on
    at once."""
    loop = asyncio.get_running_loop()
    before = {sig: signal.getsignal(sig) for sig in handlers}
    for sig, handler in handlers.items():
        loop.add_signal_handler(sig, handler)
    if signal.SIGTERM in handlers and termination.asked():
        loop.call_soon(handlers[signal.SIGTERM])
    try:
        yield
    finally:
        for sig, previous in before.items():
            loop.remove_signal_handler(sig)
            signal.signal(sig, previous)


_STOPS = (signal.SIGTERM, signal.SIGINT)


async def _unless_stopped(work: Awaitable[Any]) -> Any:
    """`work`, or None when SIGTERM or SIGINT came first: the start-up is cancelled like
    any task, its clients closed by their own `finally`, instead of an interrupt raised
    wherever the signal landed (inside a connection attempt, it left a task group's
    traceback and unclosed clients)."""
    stopped = asyncio.Event()
    task = asyncio.ensure_future(work)

    def stop() -> None:
        stopped.set()
        task.cancel()

    with _signals(dict.fromkeys(_STOPS, stop)):
        try:
            return await task
        except asyncio.CancelledError:
            if stopped.is_set():
                return None
            raise


def run_processor(settings: Settings, spec: AgentSpec, bootstrap: str) -> int:
    """`stream process`: checks the endpoint, creates the topics, reads the context
    topic, then runs the units until SIGTERM or SIGINT."""
    from instanced_stream.kafka.topics import check_partitions, ensure_product_topics
    from instanced_stream.llm.factory import check_llm, endpoint, resolve_api_key
    from instanced_stream.observe.web import claim_port
    from instanced_stream.runtime.pipeline.overrides import load_overrides

    llm_url = endpoint(settings, spec)
    resolve_api_key(settings, spec)  # configuration mistakes first, before any network
    claim_port(settings.web_host, settings.web_port, "STREAM_WEB_PORT")
    probe: Probe = NO_PROBE
    if settings.crash_at:  # tests only: the fault campaign's injector, found from outside
        probe = injector(settings.crash_at)

    async def prepare() -> tuple[AgentSpec, tuple[Messages, dict[int, int]]]:
        probed = await check_llm(settings, spec)
        await ensure_product_topics(bootstrap, settings, spec)
        if spec.plan is not None:
            await check_partitions(bootstrap, settings)
        # The probed shape becomes the spec's, as if model.request had said it.
        return probed.pinned(spec), await load_overrides(bootstrap, settings.topics.context)

    prepared = asyncio.run(_unless_stopped(prepare()))
    if prepared is None:
        log.info("stopped by a signal before it started: nothing consumed, nothing committed")
        return 0
    pinned, overrides = prepared
    if setup_tracing("instanced-stream-processor"):
        log.info("tracing: spans go over OTLP (OTEL_EXPORTER_OTLP_ENDPOINT)")
    try:
        make = functools.partial(_Service, settings, pinned, bootstrap, llm_url, overrides, probe)
        return asyncio.run(_serve(make))
    finally:
        shutdown_tracing()


async def _serve(make: Callable[[], mode.Service]) -> int:
    # Built here, inside the loop that runs it: its clients bind to the running loop.
    quiet_fenced_transactions(asyncio.get_running_loop())  # a fenced stop: one line
    return await run_until_signalled(make())


async def run_until_signalled(service: mode.Service) -> int:
    """Runs `service` (faust-streaming's service library) until SIGTERM or SIGINT, or until
    one of its supervised tasks crashes it; the exit code is 1 after a crash, else 0.
    SIGUSR1 writes every task's stack to stderr (mode's `cry`). Not `mode.Worker`: its
    stop waits out a fixed one-second sleep of its own, paid by every stop and restart
    (and by the tests, hundreds of times), and it owns logging and the loop, which the
    CLI already set up."""
    starting = asyncio.ensure_future(service.start())
    stop_requested = asyncio.Event()

    def stop() -> None:
        stop_requested.set()
        starting.cancel()  # a start still joining its group stops where it waits

    handlers = dict.fromkeys(_STOPS, stop)
    handlers[signal.SIGUSR1] = functools.partial(cry, sys.stderr)
    with _signals(handlers):
        try:
            await starting
        except asyncio.CancelledError:
            if not stop_requested.is_set():
                raise
        except Exception:
            # A start that failed (no broker, a refused login) closes what it had
            # started, then its error goes on to the CLI, which says it in one line.
            try:
                await service.stop()
            except Exception:
                log.exception("stopping after a failed start failed too")
            raise
        if not stop_requested.is_set():
            stopped = asyncio.ensure_future(service.wait_until_stopped())
            asked = asyncio.ensure_future(stop_requested.wait())
            await asyncio.wait({stopped, asked}, return_when=asyncio.FIRST_COMPLETED)
            for waiter in (stopped, asked):
                waiter.cancel()
        await service.stop()  # once: mode's stop is idempotent, on_stop runs a single time
    if service.crashed:
        log.error("processor crashed: %s", service.crash_reason)
        return 1
    return 0
