"""The walk of one item (docs/architecture.md, "The walk of one item") is the code's: one
record is fetched by the real membership (on an in-memory consumer), taken by the real
pipeline, asked of the product's model client over HTTP (the simulator, in process),
staged and committed by its unit (on an in-memory transactional producer), while a
profiler hook (`sys.setprofile`) records each function of the product as it is first
entered. The doc's steps, each a module and the function the item first enters there,
must be entered in the doc's order; and once the item has gone on to a later stage it
never comes back into an earlier one's module (the unit it is tracked on excepted: the
ledger every stage writes on, not a stage). A stage calling into an earlier stage's module is
the walk climbing back (a callback into a stage it left)."""

from __future__ import annotations

import asyncio
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import orjson
import pytest
from aiohttp.test_utils import TestServer
from aiokafka.structs import TopicPartition
from instanced_stream.core.spec import load_spec
from instanced_stream.llm.factory import build_llm
from instanced_stream.runtime.units.membership import GroupAddress, MemberBounds, Membership
from instanced_stream.runtime.units.producers import Producers
from instanced_stream.settings import DEFAULT_SPEC
from instanced_stream_bench.testing.sim.server import Simulator

from tests.fakes import FakeConsumer, FakeProducer
from tests.flows import Rig

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"
PACKAGE = str(ROOT / "stream" / "instanced_stream") + "/"
LEDGER = "runtime/units/unit.py"  # the item's unit: written on by every stage
# A step of the walk: `N. **what** (`module.py`, `Function`): ...`
_STEP = re.compile(r"^\d+\. \*\*(?P<what>[^*]+)\*\* \(`(?P<module>[\w/]+\.py)`, `(?P<fn>[\w.]+)`\)")


@dataclass(frozen=True)
class Step:
    what: str
    module: str  # relative to stream/instanced_stream
    function: str  # its qualified name


def doc_steps(text: str) -> list[Step]:
    """The numbered steps of the doc's walk section."""
    section = text.split("## The walk of one item", 1)[1].split("\n## ", 1)[0]
    found = [_STEP.match(line) for line in section.splitlines()]
    return [Step(m["what"], m["module"], m["fn"]) for m in found if m]


@dataclass(frozen=True)
class Entry:
    module: str
    function: str
    caller: str | None  # the calling frame's product module, if it is one


class Tracer:
    """Every call into a function of the product, in order; a coroutine's resumption is
    not a new entry (its frame was seen before: frames are kept so their ids stay theirs)."""

    def __init__(self) -> None:
        self.entries: list[Entry] = []
        self._frames: dict[int, FrameType] = {}

    def __call__(self, frame: FrameType, event: str, _arg: Any) -> None:
        if event != "call" or not frame.f_code.co_filename.startswith(PACKAGE):
            return
        if id(frame) in self._frames:
            return  # resumed
        self._frames[id(frame)] = frame
        back = frame.f_back
        caller = _module(back) if back is not None else None
        self.entries.append(Entry(_module(frame) or "", frame.f_code.co_qualname, caller))


def _module(frame: FrameType) -> str | None:
    name = frame.f_code.co_filename
    return name[len(PACKAGE) :] if name.startswith(PACKAGE) else None


async def _walk_one_item() -> tuple[Tracer, FakeProducer]:
    """One input record, from the fetch to its committed transaction."""
    sim = TestServer(Simulator().app())
    await sim.start_server()
    spec = load_spec(DEFAULT_SPEC)
    settings = Rig(spec).settings  # the rig's own, which the client reads its key from
    llm = build_llm(settings, spec, base_url=str(sim.make_url("/v1")))
    rig = Rig(spec, max_record_bytes=1000, llm=llm)
    topics = [rig.topics.input, rig.topics.results, rig.topics.approvals]
    units = Producers(
        "unused:9092",
        "g",
        transactional=True,
        transactional_prefix="g.items",
        replace=rig.stager.staging.replacement,
        make=lambda _bootstrap, **_options: rig.producer,
    )
    membership = Membership(GroupAddress("unused:9092", "g", topics), units, MemberBounds(6))
    tp = TopicPartition(rig.topics.input, 0)
    consumer = FakeConsumer({TopicPartition(t, 0) for t in topics}, {tp: 0})
    membership.consumer = consumer
    await membership.on_partitions_assigned(consumer.assignment())
    await asyncio.gather(*(o.task for o in membership.opening.values() if o.task is not None))
    assert list(membership.units) == [0]  # the unit is open: the walk starts at the fetch
    consumer.put(tp, orjson.dumps({"_instance": "p-1", "comment": "a lovely day"}))
    tracer = Tracer()
    sys.setprofile(tracer)
    try:
        (got,) = await membership.fetcher.fetch(0, 10)
        await rig.stager.take(got.unit, got.record, got.slot)  # as the service's intake does
        await rig.stager.windower.flush()
        await asyncio.gather(*list(rig.stager.dispatch.tasks))
        for _ in range(200):  # the unit's own loop commits after its linger
            if rig.producer.offsets():
                break
            await asyncio.sleep(0.01)
    finally:
        sys.setprofile(None)
        await membership.stop()
        await llm.close()
        await sim.close()
    return tracer, rig.producer


@pytest.fixture(scope="module")
def walked() -> tuple[Tracer, FakeProducer]:
    return asyncio.run(_walk_one_item())


def test_the_doc_has_the_walk_module_by_module() -> None:
    steps = doc_steps(DOC.read_text())
    assert len(steps) >= 10, steps
    for step in steps:
        assert (ROOT / "stream" / "instanced_stream" / step.module).is_file(), step


def test_the_item_enters_each_step_in_the_docs_order(walked: tuple[Tracer, FakeProducer]) -> None:
    tracer, producer = walked
    steps = doc_steps(DOC.read_text())
    first: dict[tuple[str, str], int] = {}
    for i, entry in enumerate(tracer.entries):
        first.setdefault((entry.module, entry.function), i)
    missing = [s for s in steps if (s.module, s.function) not in first]
    assert not missing, f"the doc names steps the item never entered: {missing}"
    order = [first[(s.module, s.function)] for s in steps]
    entered = [s.what for _, s in sorted(zip(order, steps, strict=True), key=lambda p: p[0])]
    assert entered == [s.what for s in steps], "the code walks in another order than the doc"
    # Committed: the outcome and the offset in one transaction, in that order.
    kinds = [c[0] for c in producer.calls if c[0] in ("begin", "send", "offsets", "commit")]
    assert kinds[:2] == ["begin", "send"] and kinds[-2:] == ["offsets", "commit"], kinds
    assert producer.offsets()[-1] == {TopicPartition("items", 0): 1}


def test_the_item_never_returns_into_a_stage_it_has_left(
    walked: tuple[Tracer, FakeProducer],
) -> None:
    tracer, _ = walked
    stages = [s.module for s in doc_steps(DOC.read_text()) if s.module != LEDGER]
    rank = {m: stages.index(m) for m in stages}
    back = [
        f"{e.caller} -> {e.module}:{e.function}"
        for e in tracer.entries
        if e.caller in rank and e.module in rank and rank[e.caller] > rank[e.module]
    ]
    assert not back, f"the walk climbs back into stages it left: {back}"


def test_the_walk_s_checks_catch_a_doc_that_drifted(walked: tuple[Tracer, FakeProducer]) -> None:
    """Two steps swapped in the doc are found out (the order check can fail)."""
    tracer, _ = walked
    steps = doc_steps(DOC.read_text())
    first: dict[tuple[str, str], int] = {}
    for i, entry in enumerate(tracer.entries):
        first.setdefault((entry.module, entry.function), i)
    swapped = [steps[1], steps[0], *steps[2:]]
    assert [first[(s.module, s.function)] for s in swapped] != sorted(
        first[(s.module, s.function)] for s in swapped
    )


async def test_a_record_the_broker_refuses_is_replaced_without_climbing_back() -> None:
    """The refused record's dead letter is made below the units (`Replacement`): the
    commit that found the refusal never calls up into staging."""
    topic = "activity.moderateComment"
    rig = Rig(load_spec(DEFAULT_SPEC), max_record_bytes=1000, limits={topic: 1000})
    big = orjson.dumps({"_instance": "p-" + "9" * 400, "comment": "lovely post"})
    tracer = Tracer()
    sys.setprofile(tracer)
    try:
        await rig.offer(big, 0, 0)
        await rig.drain()
    finally:
        sys.setprofile(None)
    assert [d["code"] for d in rig.on("deadletter")] == ["too_large"]  # it was refused
    replaced = [e for e in tracer.entries if e.function == "Replacement.__call__"]
    assert replaced and replaced[0].caller == "runtime/units/collector.py"
    up = [e for e in tracer.entries if e.caller and e.caller.startswith("runtime/units/")]
    assert not [e for e in up if e.module.startswith("runtime/pipeline/staging")]
