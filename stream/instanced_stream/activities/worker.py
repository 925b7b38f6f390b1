"""The Activity SDK: handlers for activity topics, `async def handler(call, tool, context)`.

- `call`: the full call, arguments and meta properties (`_instance` is the producer's id,
  `_outputPath` when the processor awaits a result);
- `tool`: the tool's own definition from the agent spec, so a handler can read its schema;
- `context`: the messages the call imported through its scopes, from its own instance only.

A handler's return value is the result of an awaited call (one with `_outputPath`): the
worker publishes it to the results topic and the processor writes it into the instance's
state. For a branching path (`†state.sunny || †state.rainy`) the handler picks one by
returning `Branch(path, value)`. Fire-and-forget calls' return values are ignored.

Delivery is at least once; the worker drops call_ids it has already handled in this
process, and handlers should be idempotent across restarts (key on `call_id`).
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import logging
import signal
import sys
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import orjson
from aiokafka.errors import (
    CommitFailedError,
    IllegalGenerationError,
    IllegalStateError,
    RebalanceInProgressError,
    UnknownMemberIdError,
)
from pydantic import ValidationError

from instanced_stream import termination
from instanced_stream.core.messages import ActivityRecord, Call, DeadLetter, ResultRecord
from instanced_stream.core.spec import AgentSpec, Tool
from instanced_stream.core.wire import json_bytes
from instanced_stream.errors import SpecError
from instanced_stream.kafka import clients
from instanced_stream.kafka.publish import Publisher, PublishError
from instanced_stream.kafka.records import OutRecord
from instanced_stream.kafka.tracing import Headers, traceparent_of
from instanced_stream.observe.metrics import WorkerMetrics
from instanced_stream.observe.web import WebServer, claim_port
from instanced_stream.retry import RetryPolicy
from instanced_stream.settings import Settings

__all__ = [
    "Activities",
    "Branch",
    "Handler",
    "load_activities",
    "paths_of",
    "serve_forever",
    "spec_of_handlers",
]

log = logging.getLogger("instanced_stream.activities")

_BACKOFF = RetryPolicy(base_s=0.2, cap_s=5.0)  # a handler that raised

Handler = Callable[[Call, Tool, list[dict[str, Any]]], Awaitable[Any]]

_TRIES = 3

# A commit refused because the group moved on without this member (it was evicted, or
# its coordinator was unreachable past the session timeout), or made while a rebalance
# had taken its partitions (IllegalStateError: none assigned): the member rejoins at its
# next fetch, and what it handled is delivered again. Retriable errors (a coordinator
# that moved or is loading) aiokafka retries inside the commit itself.
_GROUP_MOVED = (
    CommitFailedError,
    UnknownMemberIdError,
    IllegalGenerationError,
    RebalanceInProgressError,
    IllegalStateError,
)


class Sink(Protocol):
    """Where the worker's records go (a `Publisher`; a fake in tests)."""

    async def publish(self, records: list[OutRecord]) -> None: ...


@dataclass(frozen=True, slots=True)
class Branch:
    """A handler's answer to a branching output path: which alternative, and the value."""

    path: str
    value: Any = None


def paths_of(call: Call) -> list[str]:
    """The alternatives of a call's output path (one for a plain path, none if absent)."""
    return [p.strip() for p in (call.output_path or "").split("||") if p.strip()]


_SEEN = 100_000


class Activities:
    """A registry of handlers, one per tool name, plus the worker that runs them."""

    def __init__(self) -> None:
        self.handlers: dict[str, Handler] = {}
        self.handled = 0
        self.duplicates = 0
        self.failed = 0
        self.answered = 0
        self.refused_commits = 0
        self._seen: OrderedDict[str, None] = OrderedDict()
        self.metrics = WorkerMetrics()

    def activity(self, name: str | None = None) -> Callable[[Handler], Handler]:
        def register(fn: Handler) -> Handler:
            self.handlers[name or fn.__name__] = fn
            return fn

        return register

    def _first_time(self, call_id: str) -> bool:
        if call_id in self._seen:
            self.duplicates += 1
            self.metrics.duplicates.inc()
            return False
        self._seen[call_id] = None
        if len(self._seen) > _SEEN:
            self._seen.popitem(last=False)
        return True

    async def handle(self, record: ActivityRecord, tool: Tool) -> Any:
        """Runs the handler for one record, retrying; raises after the last try."""
        handler = self.handlers[record.tool]
        for attempt in range(1, _TRIES + 1):
            try:
                with self.metrics.latency.labels(record.tool).time():
                    result = await handler(record.call, tool, record.context)
                self.handled += 1
                self.metrics.handled.labels(record.tool).inc()
                return result
            except Exception:
                if attempt == _TRIES:
                    raise
                log.warning(
                    "activity %s failed on %s (try %d)",
                    record.tool,
                    record.call_id,
                    attempt,
                    exc_info=True,
                )
                await asyncio.sleep(_BACKOFF.delay(attempt))
        raise AssertionError("unreachable: the last try returns or raises")

    async def run(
        self,
        settings: Settings,
        spec: AgentSpec,
        bootstrap: str,
        stop: asyncio.Event | None = None,
        group: str | None = None,
        serve: bool = False,
    ) -> None:
        """Consumes the activity topics of the registered tools until `stop` is set."""
        tools = {t.name: t for t in spec.tools if t.name in self.handlers}
        unknown = set(self.handlers) - set(tools)
        if unknown:
            raise SpecError(f"handlers for tools the spec does not declare: {sorted(unknown)}")
        topics = {t.topic or settings.topics.activity(t.name): t for t in tools.values()}
        consumer = clients.consumer(
            bootstrap,
            *topics,
            auto_offset_reset="earliest",
            group_id=group or f"{settings.topic_prefix}activities.{spec.name}",
            max_poll_interval_ms=int(settings.worker_fetch_timeout_s * 1000),
        )
        publisher = Publisher(bootstrap, client_id="stream-activities")
        web = None
        if serve:
            # Ready once it consumes; a busy port is an error (see claim_port).
            web = WebServer(self.metrics, lambda: True, settings.web_host, settings.worker_web_port)
        stop = stop or asyncio.Event()
        slots = asyncio.Semaphore(settings.worker_concurrency)

        async def one(rec: Any, tool: Tool) -> None:
            async with slots:
                await self.serve_one(
                    rec.value, tool, settings, publisher, traceparent_of(rec.headers)
                )

        try:
            # Started inside the try: a stop (Ctrl-C, a cancelled task) while they start
            # still closes both, instead of leaving an "Unclosed" client behind.
            await consumer.start()
            await publisher.start()
            if web is not None:
                await web.start()
            while not stop.is_set():
                # A fetch is handled whole before its commit: bounded by the concurrency.
                batch = await consumer.getmany(
                    timeout_ms=300, max_records=settings.worker_concurrency * 4
                )
                # Handled concurrently, committed together: at least once, as before.
                await asyncio.gather(
                    *(one(rec, topics[tp.topic]) for tp, recs in batch.items() for rec in recs)
                )
                if batch:
                    await self._commit(consumer, sum(map(len, batch.values())))
        finally:
            # Each closed even when the stop of the one before is cut short (a caller
            # that cancels again while the worker closes, as the demo's Ctrl-C does).
            try:
                await consumer.stop()
            finally:
                try:
                    await publisher.stop()
                finally:
                    if web is not None:
                        await web.stop()

    async def _commit(self, consumer: Any, handled: int) -> None:
        """Commits a handled fetch; a group that moved under the worker is ridden out."""
        try:
            await consumer.commit()
        except _GROUP_MOVED as exc:
            self.refused_commits += 1
            cause = exc.__cause__ or exc
            log.warning(
                "activities worker: the group moved on before the commit of %d calls (%s); "
                "rejoining: they are delivered again, to this worker (dropped as handled, "
                "by call_id) or to another member (handled again)",
                handled,
                type(cause).__name__,
            )

    async def serve_one(
        self,
        value: bytes | None,
        tool: Tool,
        settings: Settings,
        publisher: Sink,
        trace: Headers = (),
    ) -> None:
        """One activity record, end to end: parsed (a bad one is dead-lettered), skipped
        when its `call_id` was handled already, handled, and its result or dead letter
        published on its source partition. Any consumer loop can drive it: `serve`'s
        aiokafka loop and the faust adapter's agent run the same path."""
        try:
            record = ActivityRecord.model_validate_json(json_bytes(value) if value else b"")
        except ValidationError as exc:
            log.error("not an activity record on %s: %s", tool.name, exc.errors()[:1])
            return
        if not self._first_time(record.call_id):
            return
        try:
            result = await self.handle(record, tool)
        except Exception as exc:
            self.failed += 1
            self.metrics.failed.labels(record.tool).inc()
            if record.call.output_path:
                # The workflow must not wait for ever: it records the failure in state.
                error = f"handler raised {exc!r}"
                await self._answer(record, None, error, settings, publisher, trace)
            log.exception("activity %s gave up on %s", record.tool, record.call_id)
            letter = DeadLetter(
                code="activity_failed",
                reason=f"handler raised {exc!r}",
                scope="call",
                instance=record.instance,
                source=record.source,
                call=record.call.wire(),
                attempts=_TRIES,
            )
            await publisher.publish([_letter(letter, settings, trace)])
            return
        if record.call.output_path:
            await self._answer(record, result, None, settings, publisher, trace)

    async def _answer(
        self,
        record: ActivityRecord,
        result: Any,
        error: str | None,
        settings: Settings,
        publisher: Sink,
        trace: Headers = (),
    ) -> None:
        """Publishes an awaited call's result, to the partition of the instance's input:
        the processor that owns that partition owns the instance's state. A result too
        large for the broker (over `max_output_bytes`, or refused by it) is dead-lettered
        `too_large` and answered with an error instead: the workflow learns the call
        failed, and the worker goes on (raising here stopped it, and every restart redid
        the side effects of its whole uncommitted fetch)."""
        chosen, value = (
            (result.path, result.value) if isinstance(result, Branch) else (None, result)
        )
        answer = ResultRecord(
            call_id=record.call_id,
            instance=record.instance,
            tool=record.tool,
            value=value,
            path=chosen,
            error=error,
            source=record.source,
            turn=record.turn,
        )
        out = self._result(answer, settings, trace)
        limit = settings.max_output_bytes
        too_large = None
        if len(out.value) + len(out.key or b"") > limit:
            too_large = f"the broker takes at most {limit} (max_output_bytes)"
        else:
            try:
                await publisher.publish([out])
            except PublishError as exc:
                too_large = f"the broker refused it: {exc.message}"
        if too_large is not None:
            size = len(out.value)
            log.error("activity %s: result of %s too large", record.tool, record.call_id)
            letter = DeadLetter(
                code="too_large",
                reason=f"the result of {record.call_id} is {size} bytes; {too_large}",
                scope="call",
                instance=record.instance,
                source=record.source,
                call=record.call.wire(),
            )
            failed = answer.model_copy(
                update={"value": None, "path": None, "error": f"result too large: {too_large}"}
            )
            await publisher.publish([_letter(letter, settings, trace)])
            await publisher.publish([self._result(failed, settings, trace)])
        self.answered += 1
        self.metrics.results.inc()

    @staticmethod
    def _result(answer: ResultRecord, settings: Settings, trace: Headers) -> OutRecord:
        return OutRecord(
            settings.topics.results,
            answer.instance.encode(),
            answer.model_dump_json(exclude_none=True).encode(),
            partition=answer.source.partition if answer.source else None,
            headers=trace,
        )


def _letter(letter: DeadLetter, settings: Settings, trace: Headers) -> OutRecord:
    return OutRecord(
        settings.topics.dead_letter,
        letter.instance.encode() if letter.instance else None,
        orjson.dumps(letter.model_dump(mode="json", exclude_none=True)),
        headers=trace,
    )


def serve_forever(
    registry: Activities, settings: Settings, spec: AgentSpec, bootstrap: str, group: str | None
) -> int:
    """`stream activities`: runs until SIGTERM or SIGINT, then finishes the handlers in
    progress, commits and leaves the group (Kubernetes stops pods with SIGTERM)."""
    claim_port(settings.web_host, settings.worker_web_port, "STREAM_WORKER_WEB_PORT")

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        if termination.asked():  # recorded while the worker started (`termination`)
            stop.set()
        log.info(
            "activities worker: tools %s, concurrency %d, port %d",
            sorted(registry.handlers),
            settings.worker_concurrency,
            settings.worker_web_port,
        )
        await registry.run(settings, spec, bootstrap, stop, group=group, serve=True)
        log.info("activities worker stopped")

    asyncio.run(main())
    return 0


def spec_of_handlers(registry: Activities) -> AgentSpec:
    """A stand-in for the agent spec when a team has only its handlers: one tool per
    handler, known by name only, on its default topic `activity.<name>`."""
    tools = [
        Tool(name=name, description="(declared by the handler; no agent spec loaded)")
        for name in sorted(registry.handlers)
    ]
    if not tools:
        raise SpecError("the Activities registry has no handlers")
    return AgentSpec(name="activities", instructions="(activities worker)", tools=tools)


def load_activities(target: str) -> Activities:
    """Finds the Activities registry in a module name or a .py file path."""
    if target.endswith(".py") or Path(target).is_file():
        path = Path(target).resolve()
        # A name per file: two examples' activities.py must not replace each other.
        name = f"_activities_{path.parent.name}_{path.stem}"
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise SpecError(f"cannot import activities from {target}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    else:
        module = importlib.import_module(target)
    found = [v for v in vars(module).values() if isinstance(v, Activities)]
    if len(found) != 1:
        raise SpecError(f"{target} must define exactly one Activities registry, found {len(found)}")
    return found[0]
