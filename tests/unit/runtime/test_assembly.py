"""The composition root (runtime/assembly.py) builds what `stream process` runs without
opening a connection, and builds it by the spec: a plan gets workflows, stores and
restores; the seeds' plan-less spec gets none; the Batch API tier gets its submissions;
the fault probe reaches the group's assignor (the storm's `joined` kill)."""

from __future__ import annotations

from typing import Any

from instanced_stream.core.spec import AgentSpec, load_spec
from instanced_stream.runtime.assembly import Processor, assemble
from instanced_stream.runtime.units.membership import Fetched
from instanced_stream.runtime.units.unit import Unit
from instanced_stream.settings import EXAMPLES, Settings


class _Routes:
    """The service's side, never called while building."""

    def unit_of(self, partition: int) -> Unit | None:
        raise AssertionError("called while building")

    async def opened(self, unit: Unit) -> None:
        raise AssertionError("called while building")

    def closed(self, unit: Unit) -> None:
        raise AssertionError("called while building")

    async def other(self, got: Fetched) -> None:
        raise AssertionError("called while building")

    def reconfigure(self, spec: AgentSpec, refused: list[tuple[str, str]]) -> None:
        raise AssertionError("called while building")

    def ready_now(self) -> bool:
        raise AssertionError("called while building")


class _Probe:
    def __init__(self) -> None:
        self.seen: list[str] = []

    def at(self, point: str) -> None:
        self.seen.append(point)

    def watches(self, point: str) -> bool:
        return False


def _built(example: str, probe: Any = None, **spec_changes: Any) -> Processor:
    spec = load_spec(EXAMPLES / example / "agent.yaml")
    if spec_changes:
        spec = spec.model_copy(update=spec_changes)
    settings = Settings(spec=EXAMPLES / example / "agent.yaml", bootstrap_servers="unused:9092")
    return assemble(
        settings,
        spec,
        "unused:9092",
        "http://unused/v1",
        ({}, {}),
        probe or _Probe(),
        _Routes(),
    )


def test_a_spec_with_a_plan_gets_workflows_stores_and_restores() -> None:
    built = _built("tickets")
    assert built.pipeline.flows is not None
    assert built.restores is not None
    assert built.submissions is None  # the online tier
    assert built.pipeline.stager.flows is built.pipeline.flows
    # Nothing was started: the membership has no consumer, the producers none open.
    assert built.membership.consumer is None
    assert not built.membership.units


def test_the_seeds_plan_less_spec_keeps_nothing_of_an_instance() -> None:
    built = _built("moderation")
    assert built.pipeline.flows is None
    assert built.restores is None


def test_the_fault_probe_reaches_the_group_assignor() -> None:
    probe = _Probe()
    built = _built("tickets", probe)
    (assignor,) = built.membership.strategy
    assert assignor.probe is probe


def test_the_batch_api_tier_gets_its_record_of_submissions() -> None:
    spec = load_spec(EXAMPLES / "tickets" / "agent.yaml")
    built = _built("tickets", model=spec.model.model_copy(update={"tier": "batch"}))
    assert built.submissions is not None
    assert built.pipeline.stager.tier is built.submissions
