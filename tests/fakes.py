"""In-memory fakes: the simulator's decisions without HTTP, for unit tests."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from aiokafka import ConsumerRecord
from aiokafka.errors import MessageSizeTooLargeError
from aiokafka.structs import TopicPartition
from instanced_stream.core.instance import Instance
from instanced_stream.core.messages import SourcePosition
from instanced_stream.errors import LLMError
from instanced_stream.llm.client import Completion
from instanced_stream.runtime.state.recall import Recall
from instanced_stream.runtime.units.producers import Producers
from instanced_stream.runtime.units.unit_manager import UnitManager
from instanced_stream_bench.testing.sim.request import SimRequest, read_request
from instanced_stream_bench.testing.sim.server import Simulator


def make_batch(texts: list[str], prefix: str = "id-") -> list[Instance]:
    """Instances with ids prefix0.. at offsets 0.. of partition 0 of topic "items"."""
    return [
        Instance(
            id=f"{prefix}{i}",
            payload={"comment": t},
            source=SourcePosition(topic="items", partition=0, offset=i),
            size=len(t),
        )
        for i, t in enumerate(texts)
    ]


class FakeLLM:
    """Answers like the simulator does, in process; can fail requests on demand."""

    model = "fake"

    def __init__(self, sim: Simulator | None = None) -> None:
        self.sim = sim or Simulator()
        self.requests: list[list[dict[str, Any]]] = []
        self.asks: list[SimRequest] = []
        self.reject_marker: str | None = None
        self.messages: list[list[dict[str, str]]] = []
        # Requests of more instances than this time out; so does any holding the marker.
        self.timeout_over: int | None = None
        self.timeout_marker: str | None = None

    async def complete(
        self,
        messages: list[dict[str, str]],
        response_format: dict[str, Any],
        *,
        items: int = 1,
        max_tokens: int | None = None,
        since: float | None = None,
        keys: tuple[str, ...] = (),
    ) -> Completion:
        req = read_request(messages)
        self.requests.append(req.items)
        self.asks.append(req)
        self.messages.append(messages)
        if self.reject_marker and any(self.reject_marker in str(i) for i in req.items):
            raise LLMError("endpoint answered 400: content refused", retriable=False, status=400)
        too_big = self.timeout_over is not None and len(req.items) > self.timeout_over
        if too_big or (self.timeout_marker and self.timeout_marker in str(req.items)):
            raise LLMError("LLM request timed out", retriable=True, timeout=True)
        text = self.sim.answer(req)
        return Completion(text, "stop", 10 * len(req.items), 5 * len(req.items), 0, 0.0)

    async def close(self) -> None:
        return None


class FakePublisher:
    """Keeps what would be published; can refuse a publish for good, like a broker."""

    def __init__(self) -> None:
        self.records: list[Any] = []
        self.refuse_next = 0

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    async def publish(self, records: list[Any], sent: Any = None) -> None:
        from instanced_stream.kafka.publish import PublishError

        if sent is not None:
            sent.handed()
        if self.refuse_next and records:
            # As the broker does: the first record is refused for good, the rest land.
            self.refuse_next -= 1
            self.records.extend(records[1:])
            raise PublishError(
                "broker refused a record (fake): MessageSizeTooLargeError", [records[0]]
            )
        self.records.extend(records)


@dataclass(frozen=True, slots=True)
class Written:
    """Where the fake put a record (the broker's RecordMetadata, in what the unit reads)."""

    offset: int


@dataclass(frozen=True, slots=True)
class Sent:
    topic: str
    key: bytes | None
    value: bytes | None  # None: a tombstone
    partition: int | None
    headers: tuple[tuple[str, bytes], ...] = ()


class FakeProducer:
    """A transactional producer in memory. `calls`: what it was asked to do, in order;
    `records` and `committed`: what a read_committed consumer sees (the records and the
    group's offsets of committed transactions; outside a transaction a send lands at
    once). A record over its topic's `limits` (bytes, as the unit estimates a record's
    batch) is refused like the broker refuses it."""

    OVERHEAD = 128  # what a record batch adds to its one record (collector.py's estimate)

    def __init__(
        self, fail_send: BaseException | None = None, limits: dict[str, int] | None = None
    ) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.fail_send = fail_send
        self.limits = dict(limits or {})
        self.records: list[Sent] = []
        self.committed: dict[TopicPartition, int] = {}
        self._open: list[Sent] | None = None
        self._offsets: dict[TopicPartition, int] = {}
        self.at: list[Sent] = []  # every send, committed or not, at its offset

    async def start(self) -> None:
        self.calls.append(("start",))

    async def begin_transaction(self) -> None:
        self.calls.append(("begin",))
        self._open, self._offsets = [], {}

    async def send(self, topic: str, value: bytes | None, **kw: Any) -> asyncio.Future[Written]:
        if self.fail_send is not None:
            raise self.fail_send
        self.calls.append(("send", topic, value, kw.get("headers")))
        fut: asyncio.Future[Written] = asyncio.get_running_loop().create_future()
        key = kw.get("key")
        limit = self.limits.get(topic)
        if limit is not None and len(value or b"") + len(key or b"") + self.OVERHEAD > limit:
            fut.set_exception(MessageSizeTooLargeError())
            return fut
        sent = Sent(topic, key, value, kw.get("partition"), tuple(kw.get("headers") or ()))
        (self.records if self._open is None else self._open).append(sent)
        fut.set_result(Written(len(self.at)))  # an offset per send, as a log of them all
        self.at.append(sent)
        return fut

    async def send_offsets_to_transaction(self, offsets: dict[Any, int], group: str) -> None:
        self.calls.append(("offsets", dict(offsets), group))
        self._offsets.update(offsets)

    async def commit_transaction(self) -> None:
        self.calls.append(("commit",))
        self.records += self._open or []
        self.committed.update(self._offsets)
        self._open, self._offsets = None, {}

    async def abort_transaction(self) -> None:
        self.calls.append(("abort",))
        self._open, self._offsets = None, {}

    async def stop(self) -> None:
        self.calls.append(("stop",))

    def sent(self) -> list[bytes | None]:
        """Every value it was asked to send, committed or not."""
        return [c[2] for c in self.calls if c[0] == "send"]

    def offsets(self) -> list[dict[Any, int]]:
        """The offsets of every transaction, committed or not."""
        return [c[1] for c in self.calls if c[0] == "offsets"]


class FakeConsumer:
    """The group consumer as Membership uses it, in memory: an assignment, paused
    partitions, committed offsets, and where each partition was sought."""

    def __init__(self, assigned: set[TopicPartition], committed: dict[TopicPartition, int]) -> None:
        self.assigned = set(assigned)
        self.committed_at = dict(committed)
        self.sought: dict[TopicPartition, int] = {}
        self._paused: set[TopicPartition] = set()
        self.stopped = False
        self.waiting: dict[TopicPartition, list[ConsumerRecord[bytes, bytes]]] = {}

    def put(self, tp: TopicPartition, value: bytes, key: bytes | None = None) -> None:
        """A record the next `getmany` hands out, at the position after the last one."""
        offset = self.sought.get(tp, 0) + len(self.waiting.get(tp, []))
        rec: ConsumerRecord[bytes, bytes] = ConsumerRecord(
            tp.topic, tp.partition, offset, 0, 0, key, value, None, len(key or b""), len(value), []
        )
        self.waiting.setdefault(tp, []).append(rec)

    async def getmany(
        self, timeout_ms: int = 0, max_records: int | None = None
    ) -> dict[TopicPartition, list[ConsumerRecord[bytes, bytes]]]:
        """What `put` left on the partitions not paused, each handed out once."""
        out = {tp: recs for tp, recs in self.waiting.items() if recs and tp not in self._paused}
        for tp, recs in out.items():
            self.waiting[tp] = []
            self.sought[tp] = recs[-1].offset + 1
        return out

    async def position(self, tp: TopicPartition) -> int:
        return self.sought.get(tp, 0)

    def assignment(self) -> set[TopicPartition]:
        return set(self.assigned)

    def pause(self, *tps: TopicPartition) -> None:
        self._paused.update(tps)

    def resume(self, *tps: TopicPartition) -> None:
        self._paused.difference_update(tps)

    def paused(self) -> set[TopicPartition]:
        return set(self._paused)

    async def committed(self, tp: TopicPartition) -> int | None:
        return self.committed_at.get(tp)

    async def beginning_offsets(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        return dict.fromkeys(tps, 0)

    async def end_offsets(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        return dict.fromkeys(tps, 100)

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.sought[tp] = offset

    def highwater(self, tp: TopicPartition) -> int | None:
        return 100

    async def stop(self) -> None:
        self.stopped = True


class FakeRecall(Recall):
    """Reads a state back from what `producer` was sent, by the offset it gave."""

    def __init__(self, producer: FakeProducer) -> None:
        super().__init__("unused:9092", "changelog")
        self.producer = producer

    async def read(self, partition: int, offset: int, key: str) -> bytes:
        sent = self.producer.at[offset]
        assert sent.key == key.encode() and sent.value, (sent, key)
        self.reads += 1
        return sent.value

    async def stop(self) -> None:
        return None


@dataclass
class ChangelogRecord:
    key: bytes
    value: bytes
    offset: int


class FakeChangelog:
    """A read_committed restore consumer over one changelog partition, in memory: each
    fetch hands at most `per_fetch` records (None: all that are left)."""

    def __init__(self, records: list[ChangelogRecord], per_fetch: int | None = None) -> None:
        self.records, self.at, self.per_fetch = records, 0, per_fetch
        self.tp = TopicPartition("changelog", 0)

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    def assign(self, tps: list[TopicPartition]) -> None:
        (self.tp,) = tps

    async def beginning_offsets(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        return {self.tp: 0}

    async def end_offsets(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        return {self.tp: len(self.records)}

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.at = offset

    async def position(self, tp: TopicPartition) -> int:
        return self.at

    async def getmany(
        self, tp: TopicPartition, timeout_ms: int
    ) -> dict[TopicPartition, list[ChangelogRecord]]:
        end = len(self.records) if self.per_fetch is None else self.at + self.per_fetch
        found, self.at = self.records[self.at : end], min(end, len(self.records))
        return {tp: found}


UNIT_TOPICS = ["items", "stream.results", "stream.approvals"]


def fake_unit_manager() -> tuple[UnitManager, list[FakeProducer]]:
    """A units' manager on fake clients (partition 0 of the three co-partitioned topics
    assigned), and the transactional producers it makes, in order."""
    made: list[FakeProducer] = []

    def make(_bootstrap: str, **_options: Any) -> FakeProducer:
        made.append(FakeProducer())
        return made[-1]

    producers = Producers("b:9092", "g", transactional=True, transactional_prefix="g", make=make)
    manager = UnitManager(UNIT_TOPICS, producers, {})
    manager.consumer = FakeConsumer({TopicPartition(t, 0) for t in UNIT_TOPICS}, {})
    return manager, made
