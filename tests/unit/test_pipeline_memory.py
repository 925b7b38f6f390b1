"""The processor's pipeline in memory: fake LLM and publisher, real windowing and ledger."""

from __future__ import annotations

import asyncio
import functools
from typing import Any

import orjson

from instanced_stream.core.messages import SourcePosition
from instanced_stream.core.spec import AgentSpec, Tool, load_spec
from instanced_stream.runtime.delivery import Fatal
from instanced_stream.runtime.processor import Pipeline
from instanced_stream.settings import DEFAULT_SPEC, Settings
from tests.fakes import FakeLLM, FakePublisher


def _pipeline(
    spec: AgentSpec | None = None, on_fatal: Fatal | None = None
) -> tuple[Pipeline, FakePublisher]:
    pub = FakePublisher()
    settings = Settings(bootstrap_servers="unused:9092", max_record_bytes=1000)
    pipe = Pipeline(settings, spec or load_spec(DEFAULT_SPEC), FakeLLM(), pub, on_fatal=on_fatal)
    return pipe, pub


async def _feed(pipe: Pipeline, records: list[tuple[int, int, bytes]], acked: list[Any]) -> None:
    await pipe.start()
    for partition, offset, value in records:
        src = SourcePosition(topic="items", partition=partition, offset=offset)
        await pipe.offer(value, None, src, functools.partial(acked.append, (partition, offset)))
    await pipe.windower.flush()
    while pipe.tasks:
        await asyncio.gather(*list(pipe.tasks))
    await pipe.windower.stop()


def _item(i: int, text: str = "lovely post") -> bytes:
    return orjson.dumps({"_instance": f"p-{i}", "comment": f"{text} {i}"})


def _decoded(pub: FakePublisher, topic_part: str) -> list[dict[str, Any]]:
    return [orjson.loads(r.value) for r in pub.records if topic_part in r.topic]


async def test_every_record_acked_in_offset_order_with_one_outcome_each() -> None:
    pipe, pub = _pipeline()
    records = [(i % 2, i // 2, _item(i)) for i in range(60)]
    records[11] = (1, 5, b"{broken")
    acked: list[Any] = []
    await _feed(pipe, records, acked)
    for part in (0, 1):
        offsets = [o for p, o in acked if p == part]
        assert offsets == list(range(30))
    calls = _decoded(pub, "activity.moderateComment")
    letters = _decoded(pub, "deadletter")
    assert len(calls) == 59
    assert [(d["code"], d["source"]["offset"]) for d in letters] == [("not_json", 5)]
    assert pipe.stats["llm_requests"] == 3  # 59 items, windows of 25


async def test_revoked_partition_publishes_and_acks_nothing() -> None:
    pipe, pub = _pipeline()
    acked: list[Any] = []
    await pipe.start()
    for i in range(10):
        src = SourcePosition(topic="items", partition=i % 2, offset=i // 2)
        await pipe.offer(_item(i), None, src, functools.partial(acked.append, (i % 2, i // 2)))
    pipe.ledger.drop([("items", 1)])
    await pipe.windower.flush()
    await asyncio.gather(*list(pipe.tasks))
    await pipe.windower.stop()
    assert {p for p, _ in acked} == {0}
    assert {r.origin[1] for r in pub.records if r.origin} == {0}


async def test_a_refused_record_dead_letters_its_item_only_and_nothing_stalls() -> None:
    pipe, pub = _pipeline()
    pub.refuse_next = 1
    acked: list[Any] = []
    await _feed(pipe, [(0, i, _item(i)) for i in range(5)], acked)
    letters = _decoded(pub, "deadletter")
    assert [d["code"] for d in letters] == ["too_large"]  # the refused record's item alone
    calls = _decoded(pub, "activity.moderateComment")
    assert letters[0]["instance"] not in {c["instance"] for c in calls}
    assert len(calls) == 4  # its batch-mates were published, not dead-lettered
    assert len(acked) == 5


async def test_an_output_over_the_broker_limit_is_dead_lettered_before_it_is_sent() -> None:
    pipe, pub = _pipeline()
    pipe.delivery.max_output_bytes = 1200
    big = "b" * 500  # an id is copied into each of its records: those outgrow the limit
    acked: list[Any] = []
    huge = orjson.dumps({"_instance": big, "comment": "a fine remark"})
    await _feed(pipe, [(0, 0, huge), (0, 1, _item(1))], acked)
    letters = _decoded(pub, "deadletter")
    assert letters and {(d["code"], d["instance"]) for d in letters} == {("too_large", big)}
    assert letters[0]["raw_size"] > 1200 and "max_output_bytes" in letters[0]["reason"]
    sent = [orjson.loads(r.value) for r in pub.records if "deadletter" not in r.topic]
    assert {s["instance"] for s in sent} == {"p-1"}  # its batch-mate went out as usual
    assert len(acked) == 2


async def test_latent_calls_are_never_published() -> None:
    base = load_spec(DEFAULT_SPEC)
    think = Tool(name="think", description="a private thought", kind="latent")
    spec = base.model_copy(update={"tools": [base.tools[0], think]})
    pipe, pub = _pipeline(spec)
    acked: list[Any] = []
    await _feed(pipe, [(0, 0, _item(0, "you stupid idiot")), (0, 1, _item(1))], acked)
    assert not [r for r in pub.records if "think" in r.topic]
    assert pipe.stats["latent_calls"] == 2  # one thought per instance
    assert len(_decoded(pub, "activity.moderateComment")) == 2


async def test_oversized_record_dead_letter_keeps_a_capped_copy() -> None:
    pipe, pub = _pipeline()
    acked: list[Any] = []
    await _feed(pipe, [(0, 0, b'{"_instance": "x", "c": "' + b"y" * 5000 + b'"}')], acked)
    (letter,) = _decoded(pub, "deadletter")
    assert letter["code"] == "too_large" and letter["raw_size"] > 5000
    assert acked == [(0, 0)]


async def test_a_batch_that_cannot_be_delivered_at_all_crashes_the_worker() -> None:
    crashed: list[BaseException] = []

    async def crash(exc: BaseException) -> None:
        crashed.append(exc)

    pipe, pub = _pipeline(on_fatal=crash)

    async def refuse(records: list[Any], sent: Any = None) -> None:
        raise RuntimeError("the publisher is broken")

    pub.publish = refuse  # type: ignore[method-assign]
    acked: list[Any] = []
    await _feed(pipe, [(0, i, _item(i)) for i in range(3)], acked)
    # Retried, then dead-lettering failed too: nothing acked, the worker told to crash.
    assert acked == []
    assert len(crashed) == 1 and "the publisher is broken" in repr(crashed[0])
