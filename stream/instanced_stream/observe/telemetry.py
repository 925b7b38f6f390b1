"""OpenTelemetry traces: a span per batch, linked to the trace of each item it holds, and
a child span per LLM request with the GenAI semantic conventions' attributes.

Off unless OTEL_EXPORTER_OTLP_ENDPOINT (or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) is set:
then spans go over OTLP/HTTP to that collector, configured by the standard OTEL_*
variables (service name, headers, batch delays). Unset, the API's no-op tracer costs a
function call. Items' contexts come from their records' `traceparent` and `tracestate`
headers (W3C Trace Context, read by OpenTelemetry's own propagator). A batch serves many
items of many traces, so it is a root span of its own with a link to each item's context
(OpenTelemetry's answer to fan-in), not a child of one of them.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator
from typing import Any
from urllib.parse import urlsplit

from opentelemetry import trace
from opentelemetry.trace import Link, Span, SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from instanced_stream.core.model import Completion

__all__ = [
    "answered",
    "batch_span",
    "context_of",
    "current_ids",
    "llm_span",
    "provider_of",
    "setup_tracing",
    "shutdown_tracing",
]

_TRACER = "instanced_stream"
_PROPAGATOR = TraceContextTextMapPropagator()


def setup_tracing(service: str) -> bool:
    """Exports spans over OTLP when a collector is configured; whether it does."""
    if not (
        os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    ):
        return False
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    # OTEL_SERVICE_NAME, when set, wins over ours (Resource.create reads it).
    resource = Resource.create({"service.name": service})
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    return True


def shutdown_tracing() -> None:
    """Flushes the spans still queued (the provider's own shutdown; no-op when off)."""
    provider = trace.get_tracer_provider()
    shutdown = getattr(provider, "shutdown", None)
    if callable(shutdown):
        shutdown()


def context_of(headers: Iterable[tuple[str, bytes]]) -> trace.SpanContext | None:
    """The span context a record's traceparent/tracestate headers carry, if valid."""
    carrier = {name.lower(): value.decode("latin-1") for name, value in headers}
    if "traceparent" not in carrier:
        return None
    found = trace.get_current_span(_PROPAGATOR.extract(carrier)).get_span_context()
    return found if found.is_valid else None


@contextlib.contextmanager
def batch_span(batch_id: str, contexts: Iterable[trace.SpanContext | None]) -> Iterator[Span]:
    links = [Link(c) for c in contexts if c is not None]
    tracer = trace.get_tracer(_TRACER)
    with tracer.start_as_current_span(
        f"batch {batch_id}",
        kind=SpanKind.CONSUMER,
        links=links,
        attributes={"messaging.system": "kafka", "messaging.batch.message_count": len(links)},
    ) as span:
        yield span


# Well-known `gen_ai.provider.name` values of the GenAI conventions, by the endpoint's host
# (its suffix); an endpoint of one's own (vLLM, Ollama, llama.cpp) is none of them.
_PROVIDERS = (
    ("api.openai.com", "openai"),
    (".openai.azure.com", "azure.ai.openai"),
    (".services.ai.azure.com", "azure.ai.inference"),
    ("models.inference.ai.azure.com", "azure.ai.inference"),
    ("api.anthropic.com", "anthropic"),
    ("api.mistral.ai", "mistral_ai"),
    ("api.groq.com", "groq"),
    ("api.deepseek.com", "deepseek"),
    ("api.x.ai", "x_ai"),
    ("api.perplexity.ai", "perplexity"),
    ("generativelanguage.googleapis.com", "gcp.gemini"),
    ("aiplatform.googleapis.com", "gcp.vertex_ai"),
    (".amazonaws.com", "aws.bedrock"),
)
# The conventions' advice for a provider they do not list: a name of one's own.
OTHER_PROVIDER = "openai_compatible"


def provider_of(base_url: str, configured: str | None = None) -> str:
    """`gen_ai.provider.name` for an endpoint: the setting if given, else the
    conventions' name for a known host, else `openai_compatible`."""
    if configured:
        return configured
    host = (urlsplit(base_url).hostname or "").lower()
    for suffix, name in _PROVIDERS:
        if host == suffix.lstrip(".") or host.endswith(suffix):
            return name
    return OTHER_PROVIDER


def _server(base_url: str) -> dict[str, Any]:
    """`server.address` (the host only, as the conventions define it) and `server.port`."""
    parts = urlsplit(base_url)
    found: dict[str, Any] = {"server.address": parts.hostname or ""}
    try:
        port = parts.port
    except ValueError:
        port = None
    if port is None and parts.scheme in ("http", "https"):
        port = 443 if parts.scheme == "https" else 80
    if port is not None:
        found["server.port"] = port
    return found


@contextlib.contextmanager
def llm_span(model: str, base_url: str, provider: str | None = None) -> Iterator[Span]:
    """A chat request, a child of the current (batch) span; `answered` fills in usage.
    `base_url` is the endpoint's URL; `provider` overrides the name derived from it."""
    tracer = trace.get_tracer(_TRACER)
    with tracer.start_as_current_span(
        f"chat {model}",
        kind=SpanKind.CLIENT,
        attributes={
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": provider_of(base_url, provider),
            "gen_ai.request.model": model,
            **_server(base_url),
        },
    ) as span:
        yield span


def answered(span: Span, model: str | None, done: Completion) -> None:
    """Usage of an answered request, with the GenAI conventions' names: cached prompt
    tokens are part of the input tokens (as providers report and bill them), reasoning
    tokens part of the output tokens."""
    if not span.is_recording():
        return
    attributes: dict[str, Any] = {
        "gen_ai.usage.input_tokens": done.prompt_tokens,
        "gen_ai.usage.output_tokens": done.completion_tokens,
        "gen_ai.usage.cache_read.input_tokens": done.cached_tokens,
        "gen_ai.usage.reasoning.output_tokens": done.reasoning_tokens,
    }
    if model:
        attributes["gen_ai.response.model"] = model
    if done.finish_reason:
        attributes["gen_ai.response.finish_reasons"] = [done.finish_reason]
    span.set_attributes(attributes)


def current_ids() -> dict[str, str]:
    """The current span's trace and span ids, for a log line (none outside a span)."""
    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return {}
    return {"trace_id": f"{context.trace_id:032x}", "span_id": f"{context.span_id:016x}"}
