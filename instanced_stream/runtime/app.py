"""The faust app around the pipeline: agents for the input, results and approvals topics,
timers, rebalance handlers, and the collaborators assembled once, in order.

The workarounds for faust's known pitfalls live here (DESIGN.md, section 3): streams are
read with `noack()` and acked by the offset ledger in offset order; every commit faust
proposes is capped by that ledger (`_cap_commits`); `stream_wait_empty=False`; and a
crashed agent crashes the worker (`CrashingSupervisor`) so the group redelivers.
"""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, cast

import faust
import mode
import orjson
from faust.types import TP

from instanced_stream.core.overrides import Messages, apply_overrides
from instanced_stream.core.prompt import PromptBuilder
from instanced_stream.core.spec import AgentSpec
from instanced_stream.core.state import TableStore
from instanced_stream.core.workflow import Workflow
from instanced_stream.llm.factory import build_llm
from instanced_stream.ops.metrics import Metrics
from instanced_stream.ops.web import WebServer
from instanced_stream.runtime.continuity import Continuity
from instanced_stream.runtime.feed import Feed
from instanced_stream.runtime.offsets import Entry, OffsetLedger, TopicPartition
from instanced_stream.runtime.overrides import OverrideFollower
from instanced_stream.runtime.probe import NO_PROBE, Probe
from instanced_stream.runtime.processor import Pipeline, limiter_for
from instanced_stream.runtime.publish import Publisher
from instanced_stream.runtime.security import faust_credentials
from instanced_stream.runtime.service import run_units
from instanced_stream.settings import Settings

__all__ = ["build_app", "run_processor"]

log = logging.getLogger("stream.processor")

Handler = Callable[[bytes | None, Entry | None], Awaitable[None]]


class _App(faust.App):
    """faust's app, with a drain before it stops (faust stops its consumer first)."""

    drain: Callable[[], Awaitable[None]] | None = None

    async def on_stop(self) -> None:
        if self.drain is not None:
            try:
                await self.drain()
                await self.consumer.commit()
            except Exception:  # a failed drain costs a redo, never the shutdown
                log.exception("drain failed; unfinished batches are redone by the next owner")
        await super().on_stop()


def _faust_app(settings: Settings, bootstrap: str) -> _App:
    return _App(
        settings.topic_prefix + settings.app_id,
        broker=f"kafka://{bootstrap}",
        key_serializer="raw",
        value_serializer="raw",
        store="memory://",
        datadir=str(settings.data_dir),
        consumer_auto_offset_reset="earliest",
        broker_commit_interval=settings.commit_interval,
        broker_session_timeout=settings.session_timeout_s,
        broker_heartbeat_interval=settings.session_timeout_s / 5,
        # Waiting for in-flight batches on a rebalance would stall the group during an
        # LLM outage; their items are redone by the new owner instead (same call_ids).
        stream_wait_empty=False,
        web_enabled=False,
        topic_partitions=settings.partitions,
        topic_allow_declare=False,
        # An agent that crashed cannot be resumed in place: its unfinished records would
        # never be redelivered. Crash the worker instead; the group redelivers from the
        # last commit and the process supervisor (Kubernetes, compose) restarts it.
        agent_supervisor=mode.CrashingSupervisor,
        broker_credentials=faust_credentials(bootstrap),
    )


def _cap_commits(app: faust.App, ledger: OffsetLedger, tracked: set[str], fed: str) -> None:
    """Every commit of the tracked topics is the ledger's commit point, never faust's own.

    faust proposes from its acked list, which holds records it skipped on its own, and it
    removes what it proposed from that list: a proposal refused or cut short is never
    made again, and an idle partition would stay uncommitted. So faust's list is drained
    only when the ledger can answer, and the ledger's answer is what is committed. The
    `fed` topic's records never reach faust (instanced_stream/runtime/feed.py): its partitions are
    offered for a commit on every round, not only when faust holds acks for them."""
    consumer: Any = app.consumer  # faust exposes no public hook for this
    proposed = consumer._new_offset
    pending = consumer._filter_tps_with_pending_acks

    def with_fed(topics: Any = None) -> Iterator[Any]:
        found = set(pending(topics))
        found.update(
            tp
            for tp in consumer.assignment()
            if tp.topic == fed and (topics is None or tp in topics or fed in topics)
        )
        return iter(found)

    def capped(tp: Any) -> int | None:
        if tp.topic not in tracked:
            return cast(int | None, proposed(tp))
        limit = ledger.commit_point((tp.topic, tp.partition))
        if limit is not None:
            proposed(tp)  # drains faust's acked list (it asks while that holds anything)
        return limit

    consumer._new_offset = capped
    consumer._filter_tps_with_pending_acks = with_fed


def build_app(
    settings: Settings,
    spec: AgentSpec,
    bootstrap: str,
    llm_url: str,
    overrides: tuple[Messages, dict[int, int]] | None = None,
    *,
    probe: Probe = NO_PROBE,
) -> faust.App:
    """The processor app. `overrides`: what the context topic held at start, and where
    each of its partitions ended, so the pipeline follows it from there. `probe`: told
    of the pipeline's named moments (the fault campaign's injector; else nothing)."""
    app = _faust_app(settings, bootstrap)
    metrics = Metrics(spec.model)
    limiter = limiter_for(spec, metrics)
    llm = build_llm(settings, spec, listener=metrics, limiter=limiter, base_url=llm_url)
    messages, ends = overrides or ({}, {})
    merged, refused = apply_overrides(spec, messages) if overrides else (spec, [])
    # Instance state: a changelog-backed table, co-partitioned with the input topic.
    table = app.Table(
        "state", default=None, partitions=settings.partitions, key_type=bytes, value_type=bytes
    )
    workflow = None
    if PromptBuilder(merged).stateful:
        # No plan, no awaited calls: no state to keep (a publish per item for nothing).
        workflow = Workflow(
            merged, TableStore(table), settings.pending_timeout_s, settings.state_retention_s
        )
    pipeline = Pipeline(
        settings,
        merged,
        llm,
        Publisher(bootstrap, probe=probe, request_timeout_ms=settings.publish_timeout_ms),
        metrics=metrics,
        limiter=limiter,
        workflow=workflow,
        on_fatal=app.crash,
        probe=probe,
    )
    pipeline.refused(refused)
    continuity = _continuity(app, settings, pipeline)

    async def drain() -> None:
        await pipeline.drain(settings.drain_s)
        # The commit that follows needs where reading began (a worker stopped within
        # seconds of its assignment may not have learnt it yet); only known once faust
        # has sought the partitions to their committed offsets.
        if _steady(app, pipeline):
            await continuity.begin(_tracked(app, continuity))

    app.drain = drain
    web = WebServer(
        metrics,
        # Ready means decisions flow: not while the endpoint refuses us or keeps failing.
        lambda: pipeline.started and not app.rebalancing and metrics.endpoint_ok,
        settings.web_host,
        settings.web_port,
    )
    follower = None
    if overrides is not None:
        topic = settings.topics.context
        follower = OverrideFollower(bootstrap, topic, spec, messages, ends, pipeline.reconfigure)
    feed = Feed(settings.topics.input, continuity.handling[settings.topics.input])
    _agents(app, settings, pipeline, web, follower, continuity, feed)
    _timers(app, settings, pipeline, continuity)
    _rebalances(app, pipeline, feed)
    return app


def _agents(
    app: faust.App,
    settings: Settings,
    pipeline: Pipeline,
    web: WebServer,
    follower: OverrideFollower | None,
    continuity: Continuity,
    feed: Feed,
) -> None:
    topics = settings.topics

    def topic(name: str) -> Any:
        return app.topic(name, key_type=bytes, value_type=bytes)

    async def follow(stream: Any, handle: Handler) -> None:
        async for event in stream.noack().events():
            msg = event.message
            entry = pipeline.ledger.track((msg.topic, msg.partition), msg.offset, event.ack)
            with continuity.handling[msg.topic].one():
                await handle(msg.value, entry)

    @app.agent(topic(topics.results), concurrency=1)
    async def results(stream: Any) -> None:
        await follow(stream, pipeline.on_result)

    @app.agent(topic(topics.approvals), concurrency=1)
    async def approvals(stream: Any) -> None:
        await follow(stream, pipeline.on_approval)

    @app.agent(topic(topics.input), concurrency=1)
    async def process(stream: Any) -> None:
        # The input's records come through the feed, never through this stream; the
        # agent only makes faust subscribe to the topic and balance it with the table.
        tracked = {topics.input, topics.results, topics.approvals}
        _cap_commits(app, pipeline.ledger, tracked, topics.input)
        await pipeline.start()
        await _serve(web)
        if follower is not None:
            await follower.start()
        try:
            await feed.run(pipeline.offer)
        finally:
            await web.stop()
            if follower is not None:
                await follower.stop()
            await pipeline.stop()


async def _serve(web: WebServer) -> None:
    try:
        await web.start()
    except OSError as exc:
        # A busy port must not stop the stream: it only costs the page and probes.
        log.warning("web server not started on port %d: %s", web.port, exc)


def _continuity(app: faust.App, settings: Settings, pipeline: Pipeline) -> Continuity:
    """The continuity watch over the three tracked topics, on faust's consumer."""
    topics = settings.topics
    return Continuity(
        pipeline.ledger, [topics.input, topics.results, topics.approvals], _Watched(app)
    )


class _Watched:
    """faust's consumer as the continuity watch sees it."""

    def __init__(self, app: faust.App) -> None:
        self.app = app

    @property
    def consumer(self) -> Any:
        return self.app.consumer

    async def ends(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        found = await self.consumer.highwaters(*(TP(*tp) for tp in tps))
        return {(tp.topic, tp.partition): int(end) for tp, end in found.items()}

    async def position(self, tp: TopicPartition) -> int | None:
        return cast(int | None, await self.consumer.position(TP(*tp)))

    async def starts(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        # faust keeps the committed offset it sought to (None for none, and for 0);
        # without one, reading began at the earliest offset (auto_offset_reset).
        found: dict[TopicPartition, int] = {}
        for tp in tps:
            committed = self.consumer._committed_offset.get(TP(*tp))
            if committed is not None:
                found[tp] = int(committed)
        rest = [TP(*tp) for tp in tps if tp not in found]
        if rest:
            earliest = await self.consumer.earliest_offsets(*rest)
            found.update({(tp.topic, tp.partition): int(o) for tp, o in earliest.items()})
        return found

    async def seek(self, tp: TopicPartition, offset: int) -> None:
        await self.consumer.seek(TP(*tp), offset)

    def held(self, tp: TopicPartition) -> str | None:
        consumer = self.consumer
        if not consumer.flow_active:
            return "faust's flow is stopped"
        if TP(*tp) in consumer._paused_partitions:
            return "paused by faust"
        active = consumer._active_partitions
        if active is not None and TP(*tp) not in active:
            return "not among faust's active partitions"
        return None

    def release(self, tp: TopicPartition) -> None:
        # Only called between rebalances (`_steady`), when faust itself holds nothing.
        self.consumer.resume_partitions({TP(*tp)})
        if not self.consumer.flow_active:
            self.consumer.resume_flow()


def _tracked(app: faust.App, continuity: Continuity) -> list[TopicPartition]:
    """The assigned partitions of the topics whose records the ledger tracks."""
    return [
        (tp.topic, tp.partition)
        for tp in app.consumer.assignment()
        if tp.topic in continuity.handling
    ]


def _steady(app: faust.App, pipeline: Pipeline) -> bool:
    """No rebalance under way, the tables recovered, the pipeline started: what the
    timers that act on owned partitions wait for."""
    return not app.rebalancing and not getattr(app, "in_recovery", False) and pipeline.started


def _timers(app: faust.App, settings: Settings, pipeline: Pipeline, continuity: Continuity) -> None:
    recovered: set[int] = set()  # input partitions whose workflows were recovered

    @app.timer(1.0)  # type: ignore[untyped-decorator]
    async def expire() -> None:
        # Only once the tables are recovered, and only for partitions owned now: a
        # workflow that moved in a rebalance is driven by its new owner alone.
        if not _steady(app, pipeline):
            return
        await continuity.begin(_tracked(app, continuity))  # commits wait for it
        owned = {
            tp.partition for tp in app.consumer.assignment() if tp.topic == settings.topics.input
        }
        new = owned - recovered
        recovered.intersection_update(owned)
        if new:
            log.info("recovering the workflows of partitions %s", sorted(new))
            await pipeline.recover(new.__contains__)
            recovered.update(new)
        await pipeline.expire(owned.__contains__)

    @app.timer(5.0)  # type: ignore[untyped-decorator]
    async def lag() -> None:
        lags = {}
        for tp in app.consumer.assignment():
            if tp.topic == settings.topics.input:
                high = app.consumer.highwater(tp) or 0
                done = pipeline.ledger.commit_point((tp.topic, tp.partition))
                lags[tp.partition] = max(0, high - (done if done is not None else high))
        pipeline.metrics.set_lag(lags)
        if _steady(app, pipeline):
            before = continuity.reread, continuity.refetched
            await continuity.check(_tracked(app, continuity))
            if (continuity.reread, continuity.refetched) != before:
                pipeline.metrics.count(
                    {
                        "records_reread": continuity.reread - before[0],
                        "partitions_refetched": continuity.refetched - before[1],
                    }
                )

    @app.timer(30.0)  # type: ignore[untyped-decorator]
    async def report() -> None:
        # A periodic one-line summary, for logs without a metrics scraper.
        log.info(
            "stats %s open=%d in_flight=%d",
            orjson.dumps(pipeline.metrics.counts()).decode(),
            pipeline.ledger.open_count(),
            len(pipeline.tasks),
        )


def _rebalances(app: faust.App, pipeline: Pipeline, feed: Feed) -> None:
    async def on_revoked(sender: Any, *args: Any, **kwargs: Any) -> None:
        revoked = args[0] if args else kwargs.get("revoked", set())
        feed.revoked(revoked)
        dropped = pipeline.ledger.drop((tp.topic, tp.partition) for tp in revoked)
        if dropped:
            log.info(
                "rebalance: %d unfinished records of revoked partitions left to their next owner",
                dropped,
            )

    async def on_assigned(sender: Any, *args: Any, **kwargs: Any) -> None:
        assigned = args[0] if args else kwargs.get("assigned", set())
        # Before the first fetch of the new assignment: no input record reaches faust.
        feed.tap(app.consumer, app.monitor)
        feed.assigned(assigned)
        back = pipeline.ledger.rewinds((tp.topic, tp.partition) for tp in assigned)
        for tp in assigned:
            offset = back.get((tp.topic, tp.partition))
            if offset is not None:
                log.info("rebalance: re-reading %s/%d from %d", tp.topic, tp.partition, offset)
                await app.consumer.seek(tp, offset)

    app.on_partitions_revoked.connect(on_revoked)  # type: ignore[arg-type]
    app.on_partitions_assigned.connect(on_assigned)  # type: ignore[arg-type]


def run_processor(settings: Settings, spec: AgentSpec, bootstrap: str) -> int:
    """`stream process`: checks the endpoint, creates the topics, reads the context
    topic, then runs the faust worker until it is stopped."""
    from instanced_stream.llm.factory import check_llm, endpoint, resolve_api_key
    from instanced_stream.ops.logs import json_handler
    from instanced_stream.ops.web import claim_port
    from instanced_stream.runtime.overrides import load_overrides
    from instanced_stream.runtime.topics import check_partitions, ensure_product_topics

    llm_url = endpoint(settings, spec)
    resolve_api_key(settings, spec)  # configuration mistakes first, before any network
    claim_port(settings.web_host, settings.web_port, "STREAM_WEB_PORT")
    probe: Probe = NO_PROBE
    if settings.crash_at:  # tests only: the fault campaign's injector, wired in from here
        from instanced_stream.testing.faults import FaultProbe, arm

        arm(settings.crash_at)
        probe = FaultProbe()

    async def prepare() -> tuple[tuple[Messages, dict[int, int]], AgentSpec]:
        probed = await check_llm(settings, spec)
        await ensure_product_topics(bootstrap, settings, spec)
        if PromptBuilder(spec).stateful:
            await check_partitions(bootstrap, settings)
        # The probed shape becomes the spec's, as if model.request had said it.
        return await load_overrides(bootstrap, settings.topics.context), probed.pinned(spec)

    overrides, spec = asyncio.run(prepare())
    if settings.delivery == "exactly_once":
        return run_units(settings, spec, bootstrap, llm_url, overrides, probe)
    # asyncio.run closed its loop; faust and aiokafka want the current one at build time.
    asyncio.set_event_loop(asyncio.new_event_loop())
    app = build_app(settings, spec, bootstrap, llm_url, overrides, probe=probe)
    if settings.log_format == "json":
        app.conf.loghandlers = [json_handler()]
    worker = faust.Worker(app, loglevel=settings.log_level, quiet=True)
    # Faust's terminal spinner sets the root logger to DEBUG at WARNING and above, so
    # every library's debug record gets built: a service has no terminal to spin on.
    worker.spinner = None
    # The libraries and the app built above are about 140,000 objects that live as long
    # as the process. Frozen, the collector's full passes no longer walk them, and with
    # a larger first generation it passes less often: over an instant drain, the
    # processor's CPU per item fell by a seventh.
    gc.collect()
    gc.freeze()
    gc.set_threshold(10_000)
    worker.execute_from_commandline()
    return 0
