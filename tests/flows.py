"""The processor's runtime in memory, for the pipeline and workflow tests: the stager, the
workflows (stateful specs) and their stores, one unit per input partition on an in-memory
transactional producer, and the fake model. The pipeline is built by the product's own
wiring (`assemble_pipeline`, runtime/assembly.py); what is left out is Kafka: records are
offered here, not fetched, and what a read_committed consumer would see is read from the
producer."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson
from instanced_stream.core.instance import Instance
from instanced_stream.core.messages import Call
from instanced_stream.core.model import Model
from instanced_stream.core.spec import AgentSpec, load_spec
from instanced_stream.core.state import InstanceState
from instanced_stream.core.workflow import Workflow
from instanced_stream.kafka.publish import home_partition
from instanced_stream.runtime.assembly import assemble_pipeline, limiter_for, metrics_for
from instanced_stream.runtime.pipeline.answers import instance_of
from instanced_stream.runtime.pipeline.intake import source_of
from instanced_stream.runtime.pipeline.stager import Hosting, ModelAccess
from instanced_stream.runtime.pipeline.workflows import recalled
from instanced_stream.runtime.state.store import Stores
from instanced_stream.runtime.state.transaction import Transaction
from instanced_stream.runtime.units.collector import Refusals
from instanced_stream.runtime.units.unit import Slot, Unit
from instanced_stream.settings import Settings

from tests.fakes import FakeLLM, FakeProducer, FakeRecall, Sent

__all__ = ["TICKETS", "Rig", "lazy", "tickets_spec", "tickets_turn"]

TICKETS = Path(__file__).resolve().parents[1] / "examples" / "tickets" / "agent.yaml"


def tickets_spec() -> AgentSpec:
    return load_spec(TICKETS)


def lazy(spec: AgentSpec) -> AgentSpec:
    """The same spec with a lazy plan: every turn's calls wait for approval."""
    assert spec.plan is not None
    return spec.model_copy(update={"plan": spec.plan.model_copy(update={"mode": "lazy"})})


def tickets_turn(instance: str = "t1") -> list[tuple[str, Call]]:
    """The tickets example's first turn for `instance`, producers first, by call id: the
    lookup, the assessment whose branch the on-call page reads, a latent summary."""

    def call(tool: str, **fields: Any) -> Call:
        return Call.model_validate({"_tool": tool, "_instance": instance, **fields})

    return [
        ("c-look", call("lookupCustomer", reason="r", _outputPath="†state.customer",
                        _scopes=["input"])),
        ("c-urg", call("assessUrgency", reason="r",
                       _outputPath="†state.urgent || †state.routine", _scopes=["input"])),
        ("c-sum", call("summarize", summary="s", _outputPath="†state.summary")),
        ("c-page", call("pageOnCall", message="m", _scopes=["†state.urgent"])),
    ]  # fmt: skip


class Rig:
    """`limits`: the broker's record limit per topic (bytes), below `max_output_bytes` to
    make it refuse records the stager let through. `partitions`: the input topic's. `llm`:
    the model the pipeline asks (the in-process fake unless given)."""

    def __init__(
        self,
        spec: AgentSpec,
        *,
        stores: Stores | None = None,
        retention_s: float = 86_400.0,
        max_output_bytes: int = 1_000_000,
        max_record_bytes: int = 256_000,
        partitions: int = 1,
        limits: dict[str, int] | None = None,
        llm: Model | None = None,
    ) -> None:
        self.settings = Settings(
            bootstrap_servers="unused:9092",
            # One input partition unless a test moves partitions: every instance's own is
            # 0, so a record offered there is processed, not forwarded.
            partitions=partitions,
            max_output_bytes=max_output_bytes,
            max_record_bytes=max_record_bytes,
            pending_timeout_s=60,
            state_retention_s=retention_s,
        )
        self.topics = self.settings.topics
        self.metrics = metrics_for(spec)
        self.llm = FakeLLM()
        self.model: Model = self.llm if llm is None else llm  # the one the pipeline asks
        self.worker = "rig"
        self.stores = stores if stores is not None else Stores()
        # The product's wiring (runtime/assembly.py) on the fake model and these stores.
        built = assemble_pipeline(
            self.settings,
            spec,
            ModelAccess(self.model, limiter_for(spec, self.metrics)),
            Hosting(
                self.worker,
                self.metrics,
                ready=lambda unit, ready: self.ready.extend((unit, inst) for inst in ready),
            ),
            stores=lambda: self.stores,
        )
        # The next turns the batches' turns made ready, as the service's queue gets them;
        # a test offers them (`turns`) when it wants them asked.
        self.ready: list[tuple[Unit, Instance]] = []
        self.live = built.live  # the spec's one holder: a test changes it there
        self.builder = built.builder
        self.flows = built.flows
        self.answers = built.answers
        self.stager = built.stager
        self.producer = FakeProducer(limits=limits)
        # Finished states retire once committed, and are read back from what was sent.
        self.stores.reader = self.stores.reader or FakeRecall(self.producer)
        self.units: dict[int, Unit] = {}
        self._next: dict[tuple[str, int], int] = {}  # the next offset per topic, partition

    @property
    def workflow(self) -> Workflow:
        """The workflow, for tests that make its changes themselves: each one a
        transaction of its own, staged on its partition's unit with the unit's next commit
        (as a deadline's change is)."""
        assert self.flows is not None, "a stateless spec has no workflow"
        return self.flows.over(_StagedAtOnce(self))

    def unit(self, partition: int) -> Unit:
        """The unit of `partition`, opened (with an empty store) when first asked for."""
        if partition not in self.units:

            async def limits(topics: set[str]) -> dict[str, int]:
                return {t: n for t, n in self.producer.limits.items() if t in topics}

            async def renew(broken: Any, max_batch: int) -> Any:
                await broken.stop()  # as the membership's renewal does, before the next
                return self.producer

            refusals = Refusals(self.stager.staging.replacement, limits, renew)
            producer: Any = self.producer  # what a unit uses of AIOKafkaProducer
            unit = Unit(partition, producer, group_id="g", transactional=True, refusals=refusals)
            if self.flows is not None:
                self.flows.store_for(partition)
                unit.written = self.stores.written  # as the unit's restore wires it
            self.units[partition] = unit
        return self.units[partition]

    def _slot_at(self, topic: str, partition: int, offset: int | None) -> tuple[Slot, int]:
        at = self._next.get((topic, partition), 0) if offset is None else offset
        self._next[(topic, partition)] = at + 1
        return self.unit(partition).track(topic, at), at

    # ------------------------------------------------------------------ triggers

    def home(self, value: bytes | None, key: bytes | None = None) -> int:
        """The partition a record of this instance is processed on: its instance's for a
        stateful spec (any other forwards it there), else 0."""
        named = instance_of(value)
        if named is None:
            try:
                found = orjson.loads(value or b"")
            except orjson.JSONDecodeError:
                found = None
            named = found.get("_instance") if isinstance(found, dict) else None
        named = named if isinstance(named, str) else (key.decode() if key else None)
        if self.flows is None or named is None:
            return 0
        return home_partition(named, self.settings.partitions)

    async def offer(
        self,
        value: bytes,
        partition: int | None = None,
        offset: int | None = None,
        key: bytes | None = None,
    ) -> None:
        """An input record consumed at `partition` (its instance's by default; the next
        offset unless given)."""
        partition = self.home(value, key) if partition is None else partition
        slot, at = self._slot_at(self.topics.input, partition, offset)
        source = source_of(self.topics.input, partition, at, key, 0)
        await self.stager.offer(self.unit(partition), source, key, value, slot)

    async def result(self, value: bytes, partition: int | None = None) -> None:
        await self._answer(self.topics.results, value, partition)

    async def approval(self, value: bytes, partition: int | None = None) -> None:
        await self._answer(self.topics.approvals, value, partition)

    async def _answer(self, topic: str, value: bytes, partition: int | None) -> None:
        """As the service's lane: staged on its slot; then committed (as the unit's
        linger would, shortly), and the next turns it made ready offered."""
        assert self.flows is not None
        partition = self.home(value) if partition is None else partition
        slot, _ = self._slot_at(topic, partition, None)
        unit = self.unit(partition)
        assert await recalled(self.stores, unit, instance_of(value))
        assert self.answers is not None
        ready = self.answers.answer(unit, slot, value, result=topic == self.topics.results)
        await self.commit()
        await self.turns([(unit, inst) for inst in ready])

    async def state(self, instance: str) -> InstanceState | None:
        """The stored state of `instance`, read back first if it is retired (finished)."""
        await self.stores.recall(instance)
        return self.stores.get(instance)

    async def expire(self, now: float) -> list[Instance]:
        """The service's expiry tick at `now`; returns the next turns it offered."""
        assert self.flows is not None
        ready = self.flows.expired(self.units, now)
        await self.commit()
        await self.turns(ready)
        return [inst for _, inst in ready]

    async def turns(self, ready: list[tuple[Unit, Instance]]) -> None:
        for unit, inst in ready:
            if unit.held and not self.stager.draining:
                await self.stager.offer_turn(unit, inst)

    async def revoke(self, partition: int) -> None:
        """The partition is revoked: what its unit finished is committed, the rest is left
        to its next owner, and its store is dropped."""
        unit = self.units.pop(partition)
        await unit.close(commit=True)
        if self.flows is not None:
            self.flows.stores.drop(partition)

    def reopen(self, partition: int) -> tuple[Unit, list[Instance]]:
        """The partition assigned here again: a new unit, its store restored from what the
        changelog committed (each key's latest value), and the workflows that wait for a
        turn (as the service's `_opened` finds them)."""
        assert self.flows is not None
        self.units.pop(partition, None)
        unit = self.unit(partition)
        store = self.flows.stores.by_partition[partition]
        latest: dict[bytes, bytes | None] = {}
        changelog = self.flows.changelog
        for rec in self.producer.records:
            if rec.topic == changelog and rec.partition == partition and rec.key is not None:
                latest[rec.key] = rec.value
        for value in latest.values():
            if value:
                store.put(InstanceState.model_validate_json(value))
        turns = (self.flows.workflow.next_turn(st) for st in store.states())
        return unit, [t for t in turns if t is not None]

    # ------------------------------------------------------------------ commits

    async def drain(self) -> None:
        """The open window launched, every batch in flight staged, every unit committed."""
        await self.stager.windower.flush()
        while self.stager.dispatch.tasks:
            await asyncio.gather(*list(self.stager.dispatch.tasks))
        await self.commit()

    async def commit(self) -> None:
        for unit in list(self.units.values()):
            if unit.held:
                await unit.commit()

    @property
    def records(self) -> list[Sent]:
        """What a read_committed consumer of the output topics sees."""
        return self.producer.records

    def on(self, part: str) -> list[dict[str, Any]]:
        """The committed records whose topic ends with `part`, parsed."""
        return [orjson.loads(r.value) for r in self.records if r.topic.endswith(part) and r.value]

    def offsets(self, topic: str | None = None) -> dict[int, int]:
        """The committed offsets of `topic` (the input's unless named), per partition."""
        topic = topic or self.topics.input
        return {tp.partition: o for tp, o in self.producer.committed.items() if tp.topic == topic}


class _StagedAtOnce(Transaction):
    """A transaction that commits each write as it is made, its changelog record staged on
    its partition's unit."""

    def __init__(self, rig: Rig) -> None:
        assert rig.flows is not None
        super().__init__(rig.flows.stores)
        self.followed_by(rig.flows.workflow.indexed)
        self.rig = rig

    def put(self, value: InstanceState) -> None:
        super().put(value)
        self._staged()

    def delete(self, instance: str, partition: int) -> None:
        super().delete(instance, partition)
        self._staged()

    def _staged(self) -> None:
        for record in self.commit():
            unit = self.rig.units.get(record.partition or 0)
            if unit is not None:
                unit.stage([record])


async def until(probe: Callable[[], Awaitable[Any]], wait_s: float = 60) -> Any:
    """Polls until probe returns something truthy (or the time is up: returns it anyway)."""
    deadline = asyncio.get_running_loop().time() + wait_s
    while True:
        got = await probe()
        if got or asyncio.get_running_loop().time() > deadline:
            return got
        await asyncio.sleep(0.5)
