"""The composition root (runtime/assembly.py) builds what `stream process` runs without
opening a connection, and builds it by the spec: a plan gets workflows, stores and
restores; the seeds' plan-less spec gets none; the Batch API tier gets its submissions;
the fault probe reaches the group's assignor (the storm's `joined` kill)."""

from __future__ import annotations

import functools
from types import FunctionType, MethodType
from typing import Any

import orjson
from instanced_stream.core.instance import Instance
from instanced_stream.core.live_spec import LiveSpec
from instanced_stream.core.messages import SourcePosition
from instanced_stream.core.prompt import PromptBuilder
from instanced_stream.core.spec import Advisor, AgentSpec, load_spec
from instanced_stream.runtime.assembly import Processor, assemble
from instanced_stream.runtime.pipeline.intake import parse_item
from instanced_stream.runtime.units.unit import Unit
from instanced_stream.settings import EXAMPLES, Settings
from pydantic import BaseModel


class _Routes:
    """The service's side, never called while building."""

    def unit_of(self, partition: int) -> Unit | None:
        raise AssertionError("called while building")

    async def opened(self, unit: Unit) -> None:
        raise AssertionError("called while building")

    def closed(self, unit: Unit) -> None:
        raise AssertionError("called while building")

    def ready(self, unit: Unit, ready: list[Instance]) -> None:
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


def _pieces(root: object) -> list[object]:
    """The package's objects reachable from `root`: through attributes, containers, bound
    methods, closures and partials (the callbacks one piece was handed of another). A spec
    and other pydantic values are leaves: they are what is looked for, not pieces."""
    seen: dict[int, object] = {}
    todo: list[object] = [root]
    while todo:
        obj = todo.pop()
        if id(obj) in seen or isinstance(obj, (str, bytes, int, float, type, BaseModel)):
            continue
        seen[id(obj)] = obj
        if isinstance(obj, dict):
            todo += [*obj.keys(), *obj.values()]
        elif isinstance(obj, (list, tuple, set, frozenset)):
            todo += list(obj)
        elif isinstance(obj, MethodType):
            todo.append(obj.__self__)
        elif isinstance(obj, FunctionType):
            todo += [cell.cell_contents for cell in obj.__closure__ or ()]
        elif isinstance(obj, functools.partial):
            todo += [obj.func, *obj.args, *obj.keywords.values()]
        elif type(obj).__module__.startswith("instanced_stream."):
            todo += list(_fields(obj).values())
    return [o for o in seen.values() if type(o).__module__.startswith("instanced_stream.")]


def _fields(obj: object) -> dict[str, Any]:
    names = [*getattr(obj, "__dict__", {}), *getattr(type(obj), "__slots__", ())]
    return {n: getattr(obj, n) for n in names if hasattr(obj, n)}


def _holders(pieces: list[object]) -> dict[str, object]:
    """Which piece holds a whole spec in which attribute ("Class.attr"), and what."""
    return {
        f"{type(p).__name__}.{name}": value
        for p in pieces
        for name, value in _fields(p).items()
        if isinstance(value, AgentSpec)
    }


def test_the_live_spec_has_one_holder_that_every_piece_reads() -> None:
    """Once, a new spec from the context topic was written into six pieces that each kept
    a copy (the window's size, the solver, the quality sample, the twins, the record
    builder, the workflow). Now one holder keeps it: every piece of the processor reads
    that one, a change installed there is what every reader sees, and it writes nothing
    into any other piece."""
    spec = load_spec(EXAMPLES / "tickets" / "agent.yaml")
    built = _built("tickets", dedupe=spec.dedupe.model_copy(update={"stateful": True}))
    live = built.pipeline.live
    stager = built.pipeline.stager
    assert built.pipeline.flows is not None
    pieces = _pieces(built)
    assert {id(v) for p in pieces for v in _fields(p).values() if isinstance(v, LiveSpec)} == {
        id(live)
    }
    edition = live.edition
    # No piece keeps a spec: the live edition and what is derived from it, and the spec
    # file's own that the context topic's messages merge onto (it is not the live one).
    holders = _holders(pieces)
    assert holders == {
        "Edition.spec": edition.spec,
        "PromptBuilder.spec": edition.spec,
        "Validator._spec": edition.spec,
        "OverrideFollower.base": built.follower.base,
    }
    assert next(p for p in pieces if isinstance(p, PromptBuilder)) is edition.prompt
    twins = stager.dispatch.twins
    content = {"_instance": "c-1", "comment": "same words"}
    source = SourcePosition(topic="in", partition=0, offset=0)
    assert twins.free(parse_item(orjson.dumps(content), None, source, 4096)) is False
    assert twins.free(parse_item(orjson.dumps(content), None, source, 4096)) is True
    room = stager.size.item_tokens
    before = {(id(p), name): value for p in pieces for name, value in _fields(p).items()}

    closer = Advisor.model_validate({"id": "closer", "role": "r", "on": "finish"})
    changed = edition.spec.model_copy(
        update={"advisors": [closer], "instructions": edition.spec.instructions * 3}
    )
    live.install(changed)

    # Every reader reads the new spec, at its next use.
    assert live.spec is changed and built.pipeline.builder.spec is changed
    assert built.pipeline.flows.workflow.spec is changed
    assert built.pipeline.flows.over(built.pipeline.flows.change()).spec is changed
    assert stager.admission.live.spec is changed
    assert stager.size.item_tokens < room  # the longer instructions, counted again
    # the same content under the new spec is another cache key: not a twin of the first
    assert twins.free(parse_item(orjson.dumps(content), None, source, 4096)) is False
    # ... and nothing else was written: every piece's attributes are as they were, but the
    # holder's edition (and what the reads above remembered of the new spec).
    written = {
        f"{type(p).__name__}.{name}"
        for p in pieces
        for name, value in _fields(p).items()
        if not (value is (old := before[(id(p), name)]) or _same(value, old))
    }
    assert written == {"LiveSpec._edition", "Twins._keys", "Twins._bounded", "WindowSize._counted"}


def _same(value: object, old: object) -> bool:
    """A plain value written again as it was (a float the follower computed anew)."""
    return isinstance(value, (int, float, str, bool, type(None))) and value == old
