"""A unit's store restored again reads only the changelog's delta (issue 37): it keeps
the offset it applied, and what it changed without a commit since is undone, so a
reopened unit sees exactly what the changelog holds, however its last unit ended. And
finished states are kept out of memory, read back by offset when needed."""

from __future__ import annotations

import gc
import random
import secrets
import time
import tracemalloc

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from instanced_stream.core.state import InstanceState
from instanced_stream.kafka.security import options_for
from instanced_stream.runtime.state.recall import Recall
from instanced_stream.runtime.state.store import Stores, UnitStore
from instanced_stream_bench.harness.changelog_states import done_state

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


async def _topic(bootstrap: str, name: str) -> str:
    """A fresh changelog-like topic of one partition."""
    topic = f"{name}-{secrets.token_hex(4)}"
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **options_for(bootstrap))
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, 1, 1)])
    finally:
        await admin.close()
    return topic


async def test_a_store_restored_again_reads_the_delta_and_undoes_what_was_not_committed(
    bootstrap: str,
) -> None:
    topic = await _topic(bootstrap, "delta")
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


async def test_finished_states_restore_out_of_memory_and_are_read_back_by_offset(
    bootstrap: str,
) -> None:
    """Issue 37: finished states stayed in memory (compressed, ~880 B each) until their
    retention ended. A restore now keeps of each only its record's offset and when it
    ended, and one is read back from the changelog when an answer or input needs it."""
    topic = await _topic(bootstrap, "retired")
    rng = random.Random(7)
    n = 3000
    written = {f"done-{i:05d}": done_state(f"done-{i:05d}", 0, time.time(), rng) for i in range(n)}
    live = ("live", _state("live").model_dump_json().encode())
    await _write(bootstrap, topic, [*written.items(), live])
    store = UnitStore(topic, 0, 1_000_000)
    tracemalloc.start()
    try:
        # pydantic keeps a bounded cache of the strings it parsed (about 850 KB here, for
        # every model of the process): a first restore fills it, the second one measures
        # what the store itself keeps.
        await UnitStore(topic, 0, 1_000_000).restore(bootstrap)
        gc.collect()
        before = tracemalloc.get_traced_memory()[0]
        assert await store.restore(bootstrap) == n + 1
        gc.collect()
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    per_state = kept / n
    print(f"retained after restoring {n} finished states of ~3 KB: {per_state:.0f} B each")
    assert per_state < 400, per_state  # ~3 KB parsed, ~880 B compressed before
    stores = Stores(Recall(bootstrap, topic))
    stores.add(store)
    try:
        assert stores.held() == (1, n, 0)
        assert [st.instance for st in stores.items()] == ["live"]
        took = []
        for name in ("done-00000", "done-01234", f"done-{n - 1:05d}"):
            started = time.monotonic()
            await stores.recall(name)
            took.append(time.monotonic() - started)
            found = stores.get(name)
            assert found is not None and found.model_dump_json().encode() == written[name]
        assert stores.held() == (1, n, 3)
        print("read back in", ", ".join(f"{t * 1000:.1f} ms" for t in took))
    finally:
        await stores.close()
