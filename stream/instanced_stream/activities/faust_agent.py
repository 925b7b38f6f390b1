"""Activity handlers run by a faust app: for teams whose services are faust-streaming apps.

    app = faust.App("my-team", broker="kafka://...", processing_guarantee="exactly_once")
    serve_activities(app, activities, Settings(), spec)   # one agent on the activity topics

The agent runs the same `Activities` handlers as `stream activities` (the same dedupe on
`call_id`, retries, dead letters and results), through faust-streaming's public API only:
`app.topic`, `app.agent`, `Stream.noack`/`Stream.ack` and `app.producer`. What faust
guarantees there, and why each choice below, was measured (docs/faust.md):

- read_committed: faust's only public way to it is `processing_guarantee="exactly_once"`
  (at_least_once reads read_uncommitted and hands over aborted calls), so it is required;
- acks by hand (`noack`): a plain `async for` acks an event in a `finally`, so one whose
  handling raised is committed unhandled (faust-streaming #189);
- one event at a time: agent `concurrency>1` commits past unfinished events (#606);
- results through `app.producer` (idempotent, acks=all under exactly_once), awaited
  before the ack, to partition `source.partition`. Not `topic.send`: under exactly_once
  faust puts a send in the transaction named after the *result's* partition number
  (its TransactionManager), never the one that commits the call's offset, so it would
  buy no atomicity and tie results to unrelated partitions' commits.

So a call is handled at least once: a redelivery in this process is dropped by `call_id`;
after a restart (and faust holds its commit before an aborted transaction, so a restart
can hand over many calls again) the handler runs again and the processor refuses the
second result (`unexpected_result`). Handlers key their own side effects on `call_id`.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import faust
from aiokafka.errors import KafkaError
from faust.exceptions import ProducerSendError
from faust.types import EventT, StreamT
from faust.types.enums import ProcessingGuarantee

from instanced_stream.activities.worker import Activities, spec_of_handlers
from instanced_stream.core.spec import AgentSpec, Tool
from instanced_stream.errors import SpecError
from instanced_stream.kafka.publish import REFUSALS, PublishError
from instanced_stream.kafka.records import OutRecord
from instanced_stream.kafka.tracing import traceparent_of
from instanced_stream.retry import RetryPolicy
from instanced_stream.settings import Settings

__all__ = ["FaustSink", "serve_activities"]

log = logging.getLogger("instanced_stream.activities.faust")

_BACKOFF = RetryPolicy(base_s=0.2, cap_s=10.0)  # sends the broker did not acknowledge


class FaustSink:
    """Publishes the worker's records (results, dead letters) through faust's producer and
    waits for each acknowledgement. A record the broker refuses for itself (too large)
    raises `PublishError`, which the worker turns into a `too_large` dead letter and an
    error result; any other failure is the cluster's and is retried until it heals, so a
    call is never acked before its result is written."""

    def __init__(self, app: faust.App) -> None:
        self.app = app
        self.retries = 0

    async def publish(self, records: list[OutRecord]) -> None:
        for record in records:
            await self._send(record)

    async def _send(self, record: OutRecord) -> None:
        attempt = 0
        while True:
            attempt += 1
            try:
                await self.app.producer.send_and_wait(
                    record.topic,
                    record.key,
                    record.value,
                    record.partition,
                    None,
                    list(record.headers),
                )
                return
            except (ProducerSendError, KafkaError) as exc:
                # faust wraps what aiokafka raises while queueing; the acknowledgement's
                # own error arrives unwrapped
                cause = exc.__cause__ if isinstance(exc, ProducerSendError) else exc
                if isinstance(cause, REFUSALS):
                    raise PublishError(str(cause), [record]) from exc
                self.retries += 1
                log.warning("send to %s failed (try %d): %r", record.topic, attempt, exc)
                await asyncio.sleep(_BACKOFF.delay(attempt))


def serve_activities(
    app: faust.App,
    activities: Activities,
    settings: Settings,
    spec: AgentSpec | None = None,
    *,
    name: str = "instanced_stream_activities",
) -> Any:
    """Adds one agent to `app` that consumes the activity topics of the spec's tools that
    `activities` has handlers for, and returns it. The consumer group is the app's id:
    give each team its own, as with `stream activities --group`. Without a spec (a team
    that has only its handlers, as `stream activities --no-spec`), each handler's tool is
    known by its name only and read from its default topic `activity.<name>`."""
    guarantee: object = app.conf.processing_guarantee  # typed as its setting's class
    if guarantee is not ProcessingGuarantee.EXACTLY_ONCE:
        raise SpecError(
            "the faust app must be built with processing_guarantee='exactly_once': it is "
            "faust's only way to read the activity topics read_committed, and at_least_once "
            "hands the agent calls from aborted transactions (docs/faust.md)"
        )
    if spec is None:
        spec = spec_of_handlers(activities)
    tools = {t.name: t for t in spec.tools if t.name in activities.handlers}
    unknown = set(activities.handlers) - set(tools)
    if unknown:
        raise SpecError(f"handlers for tools the spec does not declare: {sorted(unknown)}")
    if not tools:
        raise SpecError("the Activities registry has no handlers")
    topics: dict[str, Tool] = {
        t.topic or settings.topics.activity(t.name): t for t in tools.values()
    }
    channel = app.topic(*topics, key_serializer="raw", value_serializer="raw")
    sink = FaustSink(app)

    async def handle_calls(stream: StreamT[bytes]) -> None:
        # faust hands agents its Stream; the StreamT interface omits `noack`
        assert isinstance(stream, faust.Stream)
        manual = stream.noack()
        event: EventT[bytes]
        async for event in manual.events():
            message = event.message
            trace = traceparent_of(message.headers)
            await activities.serve_one(message.value, topics[message.topic], settings, sink, trace)
            # acked only now, so a call whose handling was cut short is read again
            await manual.ack(event)

    log.info("faust agent %s on %s", name, sorted(topics))
    return app.agent(channel, name=name, concurrency=1)(handle_calls)
