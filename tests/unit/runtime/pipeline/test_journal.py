"""The answer journal (runtime/pipeline/journal.py): each validated answer written, at
its input's partition, before its batch is staged; its tombstone committed with its
outcome; a redo of the same position, turn, spec and content takes it instead of asking."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from instanced_stream.core.messages import Call
from instanced_stream.core.solve import Answer
from instanced_stream.core.spec import load_spec
from instanced_stream.core.validate import Opinion
from instanced_stream.runtime.pipeline import journal as journal_module
from instanced_stream.runtime.pipeline.journal import AnswerJournal, Entry
from instanced_stream.settings import DEFAULT_SPEC

from tests.fakes import FakeProducer, make_batch
from tests.flows import Rig

TOPIC = "app-answers-journal"
ITEMS = [b'{"_instance": "p-%d", "comment": "lovely note %d"}' % (i, i) for i in range(3)]


def _journal(rig: Rig, producer: FakeProducer) -> AnswerJournal:
    """A journal on `producer`, wired into the rig's dispatch as assembly wires it."""
    journal = AnswerJournal("unused:9092", TOPIC, rig.metrics, producer)
    rig.stager.dispatch.journal = journal
    return journal


def _compacted(*producers: FakeProducer) -> dict[str, bytes]:
    """The journal topic as a restore reads it: each key's last value, tombstones out."""
    out: dict[str, bytes] = {}
    for producer in producers:
        for rec in producer.records:
            if rec.topic != TOPIC or rec.key is None:
                continue
            if rec.value:
                out[rec.key.decode()] = rec.value
            else:
                out.pop(rec.key.decode(), None)
    return out


def _restoring(monkeypatch: pytest.MonkeyPatch, found: dict[str, bytes]) -> None:
    async def read(bootstrap: str, topic: str, partition: int) -> dict[str, bytes]:
        assert topic == TOPIC
        return {k: v for k, v in found.items() if int(k.rsplit("/", 3)[1]) == partition}

    monkeypatch.setattr(journal_module, "read_changelog", read)


async def _run(rig: Rig) -> None:
    for i, value in enumerate(ITEMS):
        await rig.offer(value, 0, i)
    await rig.drain()


def test_an_entry_gives_back_the_answer_it_was_made_of() -> None:
    [inst] = make_batch(["a rude word"])
    call = Call.model_validate(
        {"_tool": "moderateComment", "_instance": "i0", "decision": "reject", "reason": "rude"}
    )
    opinion = Opinion("tone", "i0", {"votes": {"reject": 1}}, '{"reject": 1}')
    answer = Answer(inst, [call], "i0", 4, 2, [opinion], ["tone"], [("tone", "why?")], ["x"])
    again = Entry.model_validate_json(Entry.of(answer, "ed1").model_dump_json()).answer(inst)
    assert again == answer


async def test_each_answer_is_journaled_before_staging_and_its_tombstone_commits_with_it() -> None:
    rig = Rig(load_spec(DEFAULT_SPEC), max_record_bytes=1000)
    producer = FakeProducer()
    _journal(rig, producer)
    await _run(rig)
    written = [r for r in producer.records if r.topic == TOPIC]
    keys = [f"{rig.topics.input}/0/{i}/1" for i in range(3)]
    assert [r.key.decode() for r in written if r.key] == keys
    assert all(r.partition == 0 and r.value for r in written)
    # The unit's transaction, with the outcomes and the offsets: one tombstone each.
    tombstones = [r for r in rig.records if r.topic == TOPIC]
    assert sorted(r.key.decode() for r in tombstones if r.key) == keys
    assert all(r.value is None and r.partition == 0 for r in tombstones)
    assert rig.offsets() == {0: 3}
    assert _compacted(producer, rig.producer) == {}


async def test_a_redo_takes_the_journaled_answers_and_asks_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The first owner's answers were journaled, its transaction never committed (a
    kill after the answer): the next owner's redo asks the model nothing for them and
    writes the same calls."""
    first = Rig(load_spec(DEFAULT_SPEC), max_record_bytes=1000)
    producer = FakeProducer()
    _journal(first, producer)
    await _run(first)
    assert len(first.llm.requests) == 1
    _restoring(monkeypatch, _compacted(producer))  # the tombstones were never committed
    second = Rig(load_spec(DEFAULT_SPEC), max_record_bytes=1000)
    journal = _journal(second, FakeProducer())
    assert await journal.restore(0) == 3
    await _run(second)
    assert second.llm.requests == []
    assert journal.saved == 3
    assert second.metrics.counts().get("answers_reused") == 3

    def calls(rig: Rig) -> list[Any]:
        return sorted(
            (c["instance"], c["tool"], c["call"].get("decision"))
            for c in (orjson.loads(r.value) for r in rig.records if r.value)
            if "call_id" in c
        )

    assert calls(second) == calls(first) != []
    assert sorted(r.key or b"" for r in second.records if r.topic == TOPIC) == sorted(
        r.key or b"" for r in producer.records if r.topic == TOPIC
    )


async def test_a_redo_under_another_spec_or_of_another_content_asks_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    first = Rig(load_spec(DEFAULT_SPEC), max_record_bytes=1000)
    producer = FakeProducer()
    _journal(first, producer)
    await _run(first)
    found = _compacted(producer)
    key = f"{first.topics.input}/0/0/1"
    # Item 0's entry as if the item had shown something else (a later turn's state).
    entry = Entry.model_validate_json(found[key]).model_copy(update={"content": "other"})
    found[key] = entry.model_dump_json().encode()
    _restoring(monkeypatch, found)
    changed = Rig(load_spec(DEFAULT_SPEC), max_record_bytes=1000)
    journal = _journal(changed, FakeProducer())
    await journal.restore(0)
    await _run(changed)
    assert [len(r) for r in changed.llm.requests] == [1]  # item 0 only
    assert journal.saved == 2
    spec = changed.live.spec
    other = Rig(load_spec(DEFAULT_SPEC), max_record_bytes=1000)
    other.live.install(spec.model_copy(update={"instructions": "Moderate strictly."}))
    journal = _journal(other, FakeProducer())
    await journal.restore(0)
    await _run(other)
    assert sum(len(r) for r in other.llm.requests) == 3
    assert journal.saved == 0


async def test_an_unreadable_entry_is_asked_again(monkeypatch: pytest.MonkeyPatch) -> None:
    rig = Rig(load_spec(DEFAULT_SPEC), max_record_bytes=1000)
    _restoring(monkeypatch, {f"{rig.topics.input}/0/0/1": b'{"not": "an entry"}'})
    journal = _journal(rig, FakeProducer())
    assert await journal.restore(0) == 0
    await _run(rig)
    assert sum(len(r) for r in rig.llm.requests) == 3


async def test_a_closed_partition_drops_its_entries(monkeypatch: pytest.MonkeyPatch) -> None:
    first = Rig(load_spec(DEFAULT_SPEC), max_record_bytes=1000)
    producer = FakeProducer()
    _journal(first, producer)
    await _run(first)
    _restoring(monkeypatch, _compacted(producer))
    rig = Rig(load_spec(DEFAULT_SPEC), max_record_bytes=1000)
    journal = _journal(rig, FakeProducer())
    await journal.restore(0)
    journal.drop(0)
    await _run(rig)
    assert sum(len(r) for r in rig.llm.requests) == 3
