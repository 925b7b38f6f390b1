"""A stateful pipeline in memory, for the workflow tests: the tickets example, a memory
store, the fake model and a publisher that keeps what it is given."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson

from instanced_stream.core.spec import AgentSpec, load_spec
from instanced_stream.core.state import MemoryStore
from instanced_stream.core.workflow import Workflow
from instanced_stream.runtime.processor import Pipeline
from instanced_stream.settings import Settings
from tests.fakes import FakeLLM, FakePublisher

__all__ = ["TICKETS", "drain", "lazy", "on", "pipeline", "tickets_spec"]

TICKETS = Path(__file__).resolve().parents[1] / "examples" / "tickets" / "agent.yaml"


def tickets_spec() -> AgentSpec:
    return load_spec(TICKETS)


def lazy(spec: AgentSpec) -> AgentSpec:
    """The same spec with a lazy plan: every turn's calls wait for approval."""
    assert spec.plan is not None
    return spec.model_copy(update={"plan": spec.plan.model_copy(update={"mode": "lazy"})})


def pipeline(
    spec: AgentSpec,
    store: MemoryStore | None = None,
    *,
    retention_s: float = 86_400.0,
    max_output_bytes: int = 1_000_000,
) -> tuple[Pipeline, FakePublisher, MemoryStore]:
    pub, store = FakePublisher(), store if store is not None else MemoryStore()
    settings = Settings(bootstrap_servers="unused:9092", max_output_bytes=max_output_bytes)
    workflow = Workflow(spec, store, pending_timeout_s=60, retention_s=retention_s)
    return Pipeline(settings, spec, FakeLLM(), pub, workflow=workflow), pub, store


async def drain(pipe: Pipeline) -> None:
    await pipe.windower.flush()
    while pipe.tasks:
        await asyncio.gather(*list(pipe.tasks))


def on(pub: FakePublisher, part: str) -> list[dict[str, Any]]:
    """The published records whose topic ends with `part`, parsed."""
    return [orjson.loads(r.value) for r in pub.records if r.topic.endswith(part)]
