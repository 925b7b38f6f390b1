"""JSON log lines carry the current span's trace and span ids (OpenTelemetry), and none
outside a span."""

from __future__ import annotations

import logging

import orjson
from instanced_stream.kafka.tracing import traceparent_of
from instanced_stream.observe.logs import JsonFormatter
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags


def _line(message: str) -> dict[str, object]:
    record = logging.LogRecord("stream.processor", logging.INFO, __file__, 1, message, (), None)
    return dict(orjson.loads(JsonFormatter().format(record)))


def test_json_log_lines_name_their_trace() -> None:
    assert "trace_id" not in _line("outside")
    context = SpanContext(0xABC, 0xDEF, is_remote=False, trace_flags=TraceFlags(1))
    with trace.use_span(NonRecordingSpan(context)):
        line = _line("inside")
    assert line["trace_id"] == f"{0xABC:032x}"
    assert line["span_id"] == f"{0xDEF:016x}"


def test_tracestate_travels_only_with_a_valid_traceparent() -> None:
    parent = b"00-0000000000000000000000000000abcd-00000000000000ef-01"
    both = traceparent_of([("traceparent", parent), ("tracestate", b"v=1")])
    assert both == (("traceparent", parent), ("tracestate", b"v=1"))
    assert traceparent_of([("tracestate", b"v=1")]) == ()
    assert traceparent_of([("traceparent", b"00-bad"), ("tracestate", b"v=1")]) == ()
    assert traceparent_of([("traceparent", parent), ("tracestate", b"x" * 600)]) == (
        ("traceparent", parent),
    )
