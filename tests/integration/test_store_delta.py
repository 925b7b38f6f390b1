"""A unit's store restored again reads only the changelog's delta (issue 37): it keeps
the offset it applied, and what it changed without a commit since is undone, so a
reopened unit sees exactly what the changelog holds, however its last unit ended."""

from __future__ import annotations

import secrets

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from instanced_stream.core.state import InstanceState
from instanced_stream.kafka.security import options_for
from instanced_stream.runtime.engine.store import UnitStore

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def _state(name: str, turn: int = 0) -> InstanceState:
    return InstanceState(instance=name, partition=0, turn=turn)


async def _write(bootstrap: str, topic: str, records: list[tuple[str, bytes | None]]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, **options_for(bootstrap))
    await producer.start()
    try:
        for key, value in records:
            await (await producer.send(topic, value, key=key.encode(), partition=0))
    finally:
        await producer.stop()


async def test_a_store_restored_again_reads_the_delta_and_undoes_what_was_not_committed(
    bootstrap: str,
) -> None:
    topic = f"delta-{secrets.token_hex(4)}"
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **options_for(bootstrap))
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, 1, 1)])
    finally:
        await admin.close()
    await _write(bootstrap, topic, [(n, _state(n).model_dump_json().encode()) for n in "abc"])
    store = UnitStore(topic, 0, 1_000_000)
    assert await store.restore(bootstrap) == 3 and store.restored == 3
    # Changed here, never committed (the unit failed, or its partition moved away).
    store.put(_state("a", turn=7))
    store.put(_state("d"))
    store.delete("b")
    # Committed meanwhile, by this partition's next owner.
    await _write(bootstrap, topic, [("c", _state("c", turn=2).model_dump_json().encode())])
    await _write(bootstrap, topic, [("e", _state("e").model_dump_json().encode())])
    assert await store.restore(bootstrap) == 4
    assert store.restored == 2  # the delta only
    turns = {st.instance: st.turn for st in store.states()}
    assert turns == {"a": 0, "b": 0, "c": 2, "e": 0}
