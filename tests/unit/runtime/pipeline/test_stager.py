"""The processor's runtime in memory (tests/flows.py): fake LLM and producer, real
windowing, stager and units."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest
from instanced_stream.core.spec import AgentSpec, Tool, load_spec
from instanced_stream.runtime.pipeline.dispatch import orphaned
from instanced_stream.settings import DEFAULT_SPEC

from tests.flows import Rig


def _rig(spec: AgentSpec | None = None, **kw: Any) -> Rig:
    return Rig(spec or load_spec(DEFAULT_SPEC), max_record_bytes=1000, **kw)


async def _feed(rig: Rig, records: list[tuple[int, int, bytes]]) -> None:
    for partition, offset, value in records:
        await rig.offer(value, partition, offset)
    await rig.drain()


def _item(i: int, text: str = "lovely post") -> bytes:
    return orjson.dumps({"_instance": f"p-{i}", "comment": f"{text} {i}"})


async def test_every_record_committed_in_offset_order_with_one_outcome_each() -> None:
    rig = _rig()
    records = [(i % 2, i // 2, _item(i)) for i in range(60)]
    records[11] = (1, 5, b"{broken")
    await _feed(rig, records)
    assert rig.offsets() == {0: 30, 1: 30}
    for part in (0, 1):  # each partition's outcomes are written in its input order
        outcomes = [o["source"] for o in rig.on("")]
        offsets = [s["offset"] for s in outcomes if s["partition"] == part]
        assert offsets == sorted(offsets) and set(offsets) == set(range(30))
    calls = rig.on("activity.moderateComment")
    letters = rig.on("deadletter")
    assert len(calls) == 59
    assert [(d["code"], d["source"]["offset"]) for d in letters] == [("not_json", 5)]
    assert rig.metrics.counts()["llm_requests"] == 3  # 59 items, windows of 25


async def test_a_revoked_partition_commits_nothing_of_what_it_had_not_finished() -> None:
    rig = _rig()
    for i in range(10):
        await rig.offer(_item(i), i % 2, i // 2)
    await rig.revoke(1)  # its items are still in the open window
    await rig.drain()
    assert rig.offsets() == {0: 5}
    assert {r["source"]["partition"] for r in rig.on("")} == {0}


async def test_a_refused_record_dead_letters_its_item_only_and_nothing_stalls() -> None:
    topic = "activity.moderateComment"
    rig = _rig(limits={topic: 1000})  # the broker's limit, below ours
    big = orjson.dumps({"_instance": "p-" + "9" * 400, "comment": "lovely post"})
    await _feed(rig, [(0, i, _item(i)) for i in range(4)] + [(0, 4, big)])
    letters = rig.on("deadletter")
    assert [d["code"] for d in letters] == ["too_large"]  # the refused record's item alone
    assert letters[0]["instance"].endswith("9" * 100) and "refused" in letters[0]["reason"]
    calls = rig.on(topic)
    assert letters[0]["instance"] not in {c["instance"] for c in calls}
    assert len(calls) == 4  # its batch-mates were committed, not dead-lettered
    assert rig.offsets() == {0: 5}
    assert ("abort",) in rig.producer.calls  # the refusing transaction was redone


async def test_an_output_over_the_broker_limit_is_dead_lettered_before_it_is_sent() -> None:
    rig = _rig(max_output_bytes=1200)
    big = "b" * 500  # an id is copied into each of its records: those outgrow the limit
    huge = orjson.dumps({"_instance": big, "comment": "a fine remark"})
    await _feed(rig, [(0, 0, huge), (0, 1, _item(1))])
    letters = rig.on("deadletter")
    assert letters and {(d["code"], d["instance"]) for d in letters} == {("too_large", big)}
    assert letters[0]["raw_size"] > 1200 and "max_output_bytes" in letters[0]["reason"]
    sent = [orjson.loads(r.value or b"") for r in rig.records if "deadletter" not in r.topic]
    assert {s["instance"] for s in sent} == {"p-1"}  # its batch-mate went out as usual
    assert ("abort",) not in rig.producer.calls  # nothing was refused by the broker
    assert rig.offsets() == {0: 2}


async def test_latent_calls_are_never_published() -> None:
    base = load_spec(DEFAULT_SPEC)
    think = Tool(name="think", description="a private thought", kind="latent")
    rig = _rig(base.model_copy(update={"tools": [base.tools[0], think]}))
    await _feed(rig, [(0, 0, _item(0, "you stupid idiot")), (0, 1, _item(1))])
    assert not [r for r in rig.records if "think" in r.topic]
    assert rig.metrics.counts()["latent_calls"] == 4  # two thoughts per instance
    assert len(rig.on("activity.moderateComment")) == 2


async def test_oversized_record_dead_letter_keeps_a_capped_copy() -> None:
    rig = _rig()
    await _feed(rig, [(0, 0, b'{"_instance": "x", "c": "' + b"y" * 5000 + b'"}')])
    (letter,) = rig.on("deadletter")
    assert letter["code"] == "too_large" and letter["raw_size"] > 5000
    assert rig.offsets() == {0: 1}


async def test_a_batch_that_cannot_be_committed_at_all_voids_its_unit() -> None:
    """Nothing is committed, and the unit is dropped: its partition's next owner (the
    membership reopens it) redoes the batch from the last commit."""
    rig = _rig()
    rig.producer.fail_send = RuntimeError("the producer is broken")
    for i in range(3):
        await rig.offer(_item(i), 0, i)
    with pytest.raises(RuntimeError, match="the producer is broken"):
        await rig.drain()
    assert not rig.units[0].held
    assert rig.records == [] and rig.offsets() == {}
    assert ("abort",) in rig.producer.calls


async def test_a_batch_whose_partitions_all_closed_is_cancelled_and_frees_its_slot() -> None:
    """A closed unit's batches in flight (issue 37): one that answers nothing still owned
    is cancelled, its limiter slot freed, instead of waiting for the model."""
    rig = _rig()
    asked = asyncio.Event()
    answer = rig.llm.complete

    async def slow(*args: Any, **kw: Any) -> Any:
        asked.set()
        await asyncio.Event().wait()  # the model never answers in this test
        return await answer(*args, **kw)

    rig.llm.complete = slow  # type: ignore[method-assign]
    for i in range(3):
        await rig.offer(_item(i), 1, i)
    await rig.stager.windower.flush()
    await asyncio.wait_for(asked.wait(), 5)
    assert rig.stager.dispatch.limiter.in_flight == 1 and len(rig.stager.dispatch.tasks) == 1
    await rig.revoke(1)
    [task] = orphaned(rig.stager.dispatch.tasks)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert task.cancelled() and not rig.stager.dispatch.tasks
    assert rig.stager.dispatch.limiter.in_flight == 0


async def test_a_revoked_unit_waits_for_its_batches_in_flight_up_to_its_budget() -> None:
    """A revocation gives the batches in flight on its units a bounded time to come back
    (`Stager.landed`, runtime/units/rebalance.py): what lands is staged on the suspended
    unit and its commit carries it, so the partition's next owner has nothing to ask the
    model again; a batch of other units' items is not waited for, and one that does not
    land within the budget is counted, not waited out."""
    rig = _rig()
    gate = asyncio.Event()
    asked = asyncio.Event()
    answer = rig.llm.complete

    async def gated(*args: Any, **kw: Any) -> Any:
        asked.set()
        await gate.wait()
        return await answer(*args, **kw)

    rig.llm.complete = gated  # type: ignore[method-assign]
    for i in range(3):
        await rig.offer(_item(i), 1, i)
    rig.unit(0)  # a unit with nothing in flight
    await rig.stager.windower.flush()
    await asyncio.wait_for(asked.wait(), 5)
    assert await rig.stager.landed([rig.units[0]], 5) == 0  # at once: none of its items
    assert await rig.stager.landed([rig.units[1]], 0.05) == 1  # the budget, then counted
    landing = asyncio.create_task(rig.stager.landed([rig.units[1]], 5))
    await asyncio.sleep(0.05)
    assert not landing.done()
    gate.set()
    assert await asyncio.wait_for(landing, 5) == 0
    await rig.units[1].commit()
    assert rig.offsets() == {1: 3}
    assert len(rig.on("activity.moderateComment")) == 3
