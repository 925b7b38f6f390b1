"""OpenTelemetry on a real processor process: with OTEL_EXPORTER_OTLP_ENDPOINT set, spans
reach an OTLP/HTTP collector (here a small receiver that decodes OTLP's protobuf): one
span per batch, linked to the trace of each item's `traceparent`, and under it one span per
LLM request with the GenAI attributes (model, input, output and cached tokens). The
items' `tracestate` travels with their traceparent onto the outputs."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit

import orjson
import pytest
import pytest_asyncio
from aiohttp import web
from instanced_stream.kafka import clients
from instanced_stream.kafka.topics import read_topic
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tests.conftest import Deployment

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]

STATE = b"vendor=opaque-1"


def _parent(i: int) -> bytes:
    return f"00-{0xABC000 + i:032x}-{i + 1:016x}-01".encode()


@pytest_asyncio.fixture
async def collector() -> AsyncIterator[tuple[str, list[Any]]]:
    """An OTLP/HTTP trace receiver on loopback; the spans it was sent."""
    spans: list[Any] = []

    async def receive(request: web.Request) -> web.Response:
        export = ExportTraceServiceRequest.FromString(await request.read())
        for resource in export.resource_spans:
            for scope in resource.scope_spans:
                spans.extend(scope.spans)
        return web.Response(body=b"", content_type="application/x-protobuf")

    app = web.Application()
    app.router.add_post("/v1/traces", receive)
    runner = web.AppRunner(app)
    await runner.setup()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}", spans
    finally:
        await runner.cleanup()


def _attributes(span: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kv in span.attributes:
        value = kv.value
        out[kv.key] = getattr(value, value.WhichOneof("value"))
    return out


async def test_batches_and_llm_requests_are_spans(
    deploy: Callable[..., Awaitable[Deployment]], collector: tuple[str, list[Any]]
) -> None:
    url, spans = collector
    dep = await deploy(
        STREAM_DELIVERY="exactly_once",
        OTEL_EXPORTER_OTLP_ENDPOINT=url,
        OTEL_BSP_SCHEDULE_DELAY="200",
    )
    producer = clients.producer(dep.bootstrap)
    await producer.start()
    try:
        for i in range(6):
            item = {"_instance": f"o-{i}", "comment": f"a kind word {i}"}
            headers = [("traceparent", _parent(i)), ("tracestate", STATE)]
            await producer.send_and_wait(
                dep.settings.topics.input, orjson.dumps(item), key=b"o", headers=headers
            )
    finally:
        await producer.stop()
    report = await dep.settle(6)
    assert report.unaccounted == 0
    traces = {int(_parent(i).split(b"-")[1], 16) for i in range(6)}
    deadline = time.monotonic() + 30
    while True:
        batches = [s for s in spans if s.name.startswith("batch ")]
        linked = {int.from_bytes(link.trace_id, "big") for b in batches for link in b.links}
        if linked >= traces:
            break
        assert time.monotonic() < deadline, f"items' traces not linked: {linked} {len(spans)}"
        await asyncio.sleep(0.5)
    by_id = {s.span_id: s for s in batches}
    chats = [s for s in spans if s.name.startswith("chat ")]
    assert chats, [s.name for s in spans]
    for chat in chats:
        parent = by_id.get(chat.parent_span_id)
        assert parent is not None, "an LLM request span outside its batch's span"
        assert chat.trace_id == parent.trace_id
        attributes = _attributes(chat)
        assert attributes["gen_ai.operation.name"] == "chat"
        assert attributes["gen_ai.request.model"] == dep.spec.model.name
        assert attributes["gen_ai.usage.input_tokens"] > 0
        assert attributes["gen_ai.usage.output_tokens"] > 0
        assert "gen_ai.usage.cache_read.input_tokens" in attributes
        # the simulator on 127.0.0.1: no provider the conventions list, the host alone
        endpoint = urlsplit(dep.proc.env["STREAM_LLM_BASE_URL"])
        assert attributes["gen_ai.provider.name"] == "openai_compatible"
        assert attributes["server.address"] == endpoint.hostname
        assert attributes["server.port"] == endpoint.port
    # The tracestate went along with its traceparent onto the outputs.
    tools = [t.name for t in dep.spec.tools if t.kind == "activity"]
    topics = [*(dep.activity_topic(t) for t in tools), dep.settings.topics.no_action]
    states = []
    for topic in topics:
        async for rec in read_topic(dep.bootstrap, topic):
            states.append(dict(rec.headers or []).get("tracestate"))
    assert states
    assert set(states) == {STATE}
