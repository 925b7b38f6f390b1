"""The changelog reader of a unit's store (runtime/state/changelog.py): it reads each
key's latest record from where the store left the partition, and sets aside a record it
cannot parse, once, until the store stages its tombstone."""

from __future__ import annotations

import contextlib

import pytest
from instanced_stream.core.state import InstanceState
from instanced_stream.kafka import clients
from instanced_stream.runtime.state.changelog import ChangelogReader
from instanced_stream.runtime.state.store import UnitStore

from tests.fakes import ChangelogRecord, FakeChangelog


def _state(instance: str, turn: int = 1) -> bytes:
    return InstanceState(instance=instance, partition=0, turn=turn).model_dump_json().encode()


def _partition(monkeypatch: pytest.MonkeyPatch, records: list[ChangelogRecord]) -> None:
    monkeypatch.setattr(clients, "consumer", lambda bootstrap: FakeChangelog(records, per_fetch=2))


async def test_the_reader_keeps_each_keys_latest_record_and_reads_only_the_delta_next(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    records = [
        ChangelogRecord(b"a", _state("a"), 0),
        ChangelogRecord(b"b", _state("b"), 1),
        ChangelogRecord(b"a", _state("a", 2), 2),
        ChangelogRecord(b"b", b"", 3),
    ]
    _partition(monkeypatch, records)
    reader = ChangelogReader("changelog", 0)
    async with contextlib.AsyncExitStack() as gated:
        latest = await reader.read("unused:9092", None, gated)
    assert latest == {"a": (2, _state("a", 2)), "b": (3, None)}
    assert reader.applied == 4 and reader.restored == 4
    records.append(ChangelogRecord(b"c", _state("c"), 4))
    async with contextlib.AsyncExitStack() as gated:
        assert await reader.read("unused:9092", None, gated) == {"c": (4, _state("c"))}
    assert reader.applied == 5 and reader.restored == 1


def test_an_unreadable_record_is_quarantined_and_taken_once() -> None:
    reader = ChangelogReader("changelog", 0)
    assert reader.parse("a", 0, _state("a")) is not None
    assert reader.parse("b", 1, b"{cut") is None
    (bad,) = reader.quarantined
    assert (bad.key, bad.partition, bad.offset, bad.value) == ("b", 0, 1, b"{cut")
    assert bad.reason.startswith("unreadable state record")
    assert reader.take() == [bad] and reader.take() == []
    reader.requarantine({"b"})  # its tombstone read back: gone for good
    assert reader.quarantined == []


def test_a_staged_record_whose_tombstone_was_not_read_back_is_quarantined_again() -> None:
    reader = ChangelogReader("changelog", 0)
    reader.parse("b", 1, b"{cut")
    (bad,) = reader.take()
    reader.requarantine({"a"})  # the unit's commit with its tombstone did not happen
    assert reader.quarantined == [bad]


async def test_a_store_opens_without_an_unreadable_record_and_stages_its_tombstone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _partition(
        monkeypatch, [ChangelogRecord(b"a", _state("a"), 0), ChangelogRecord(b"b", b"{cut", 1)]
    )
    store = UnitStore("changelog", 0, 1_000_000)
    assert await store.restore("unused:9092") == 1
    assert "a" in store and "b" not in store
    ((bad, tombstone),) = store.quarantine()
    assert bad.key == "b" and store.quarantined == []
    assert (tombstone.key, tombstone.value, tombstone.partition) == (b"b", b"", 0)
