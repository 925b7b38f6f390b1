"""A stateful instance's records are processed on its own partition only (admission and
the service's lanes, runtime/pipeline/admission.py and runtime/service.py): one
read on another partition is sent on, in that unit's transaction with its offset, to the
partition its id keys to, and nothing else is done with it there."""

from __future__ import annotations

import orjson
from instanced_stream.core.spec import load_spec
from instanced_stream.kafka.publish import home_partition
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
