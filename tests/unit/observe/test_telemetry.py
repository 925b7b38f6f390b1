"""The LLM request span's GenAI attributes: the provider named from the endpoint (or the
setting), never a fixed `openai`; `server.address` the host alone, `server.port` apart."""

from __future__ import annotations

from typing import Any

import pytest
from instanced_stream.observe.telemetry import llm_span, provider_of
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter


@pytest.mark.parametrize(
    ("url", "provider"),
    [
        ("https://api.openai.com/v1", "openai"),
        ("https://team.openai.azure.com/openai/deployments/x", "azure.ai.openai"),
        ("https://api.mistral.ai/v1", "mistral_ai"),
        ("https://api.groq.com/openai/v1", "groq"),
        ("http://127.0.0.1:8000/v1", "openai_compatible"),
        ("http://vllm.internal:8000/v1", "openai_compatible"),
    ],
)
def test_the_provider_is_named_from_the_endpoint(url: str, provider: str) -> None:
    assert provider_of(url) == provider
    assert provider_of(url, "ollama") == "ollama"  # STREAM_LLM_PROVIDER wins


@pytest.fixture(scope="module")
def exporter() -> InMemorySpanExporter:
    """Spans of this process, through the public API: the SDK's provider set once (as
    the processor's own setup_tracing does), with an in-memory exporter added."""
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        trace.set_tracer_provider(TracerProvider())
    provider = trace.get_tracer_provider()
    assert isinstance(provider, TracerProvider)
    found = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(found))
    return found


def _span(exporter: InMemorySpanExporter, url: str, provider: str | None = None) -> dict[str, Any]:
    exporter.clear()
    with llm_span("gpt-4o-mini", url, provider):
        pass
    (span,) = exporter.get_finished_spans()
    return dict(span.attributes or {})


def test_server_address_is_the_host_and_the_port_apart(exporter: InMemorySpanExporter) -> None:
    local = _span(exporter, "http://127.0.0.1:8000/v1")
    assert local["server.address"] == "127.0.0.1" and local["server.port"] == 8000
    assert local["gen_ai.provider.name"] == "openai_compatible"
    hosted = _span(exporter, "https://api.openai.com/v1")
    assert (hosted["server.address"], hosted["server.port"]) == ("api.openai.com", 443)
    assert hosted["gen_ai.provider.name"] == "openai"
    named = _span(exporter, "http://10.0.0.5:11434/v1", "ollama")
    assert named["gen_ai.provider.name"] == "ollama"
