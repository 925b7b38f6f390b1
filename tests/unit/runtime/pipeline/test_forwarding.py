"""A stateful instance's records are processed on its own partition only (admission and
the service's lanes, runtime/pipeline/admission.py and runtime/service.py): one
read on another partition is sent on, in that unit's transaction with its offset, to the
partition its id keys to, and nothing else is done with it there."""

from __future__ import annotations

import orjson
from instanced_stream.core.spec import load_spec
from instanced_stream.kafka.publish import forwarded_from, home_partition
from instanced_stream_bench.testing.samples import tickets

from tests.flows import TICKETS, Rig


async def test_an_input_on_another_partition_is_forwarded_not_asked() -> None:
    rig = Rig(load_spec(TICKETS), partitions=4)
    ticket = tickets(1)[0]
    home = home_partition(ticket["_instance"], 4)
    elsewhere = (home + 1) % 4
    await rig.offer(orjson.dumps(ticket), partition=elsewhere)
    await rig.drain()
    assert rig.llm.requests == []  # nothing asked where the instance does not live
    sent = [r for r in rig.records if r.topic == rig.topics.input]
    assert len(sent) == 1
    assert sent[0].partition == home and sent[0].key == ticket["_instance"].encode()
    assert orjson.loads(sent[0].value or b"") == ticket
    assert rig.offsets() == {elsewhere: 1}  # committed with the forwarded copy
    assert rig.stores.get(ticket["_instance"]) is None  # no state where it does not live


async def test_an_input_on_its_own_partition_is_processed_there() -> None:
    rig = Rig(load_spec(TICKETS), partitions=4)
    ticket = tickets(1)[0]
    await rig.offer(orjson.dumps(ticket), partition=home_partition(ticket["_instance"], 4))
    await rig.drain()
    assert len(rig.llm.requests) == 1
    assert not [r for r in rig.records if r.topic == rig.topics.input]


async def test_a_context_message_on_the_input_topic_is_forwarded_to_the_context_topic() -> None:
    spec = load_spec(TICKETS).model_copy(update={"accept_context_input": True})
    rig = Rig(spec, partitions=4)
    plan = {"type": "plan", "mode": "lazy"}
    await rig.offer(orjson.dumps(plan), partition=2)
    await rig.drain()
    assert rig.llm.requests == []
    (sent,) = [r for r in rig.records if r.topic == rig.topics.context]
    assert sent.key == b"plan" and sent.partition == 0 and orjson.loads(sent.value or b"") == plan
    assert forwarded_from(sent.headers) == (rig.topics.input, 2, 0)
    assert rig.offsets() == {2: 1}  # committed with the forwarded copy
    assert rig.on("deadletter") == []


async def test_a_context_message_is_a_dead_letter_unless_the_spec_forwards_them() -> None:
    rig = Rig(load_spec(TICKETS), partitions=4)
    await rig.offer(orjson.dumps({"type": "advisor", "id": "a1", "role": "r"}), partition=1)
    await rig.drain()
    assert not [r for r in rig.records if r.topic == rig.topics.context]
    (letter,) = rig.on("deadletter")
    assert letter["code"] == "context_on_input" and rig.topics.context in letter["reason"]
    assert rig.offsets() == {1: 1}
