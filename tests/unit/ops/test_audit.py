"""The audit's exactly-once figure counts outcomes per input, not copies of one record: a
call from one run and a no-action from another are two outcomes of the same input, though
neither record repeats the other. A workflow's turns are separate decisions."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import orjson
import pytest
from instanced_stream.ops import audit as audit_module
from instanced_stream.ops.audit import AuditReport, audit
from instanced_stream.settings import Topics

TOPICS = Topics("t.", "t.items")
TOOL = TOPICS.activity("moderateComment")


@dataclass
class _Rec:
    partition: int
    offset: int
    value: bytes
    timestamp: int = 0
    key: bytes | None = None
    headers: tuple[tuple[str, bytes], ...] = ()


class _FakeReader:
    """Stands in for kafka.topics.TopicReader: each topic's records from a dict, no broker
    (the real reader is exercised by the integration tests' audits)."""

    def __init__(self, records_by_topic: dict[str, list[_Rec]]) -> None:
        self.records_by_topic = records_by_topic
        self.open = False

    async def __aenter__(self) -> _FakeReader:
        self.open = True
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.open = False

    async def partitions(self, topic: str) -> list[int]:
        return sorted({rec.partition for rec in self.records_by_topic.get(topic, [])})

    async def read(
        self, topic: str, since_ms: int | None = None, since_offset: int | None = None
    ) -> AsyncIterator[_Rec]:
        assert self.open, "read outside the reader's async with"
        for rec in self.records_by_topic.get(topic, []):
            yield rec


def _patch_reader(
    monkeypatch: pytest.MonkeyPatch, records_by_topic: dict[str, list[_Rec]]
) -> list[_FakeReader]:
    """The readers audits open from now on, in order: one per audit, closed by its end."""
    readers: list[_FakeReader] = []

    def reader(bootstrap: str) -> _FakeReader:
        readers.append(_FakeReader(records_by_topic))
        return readers[-1]

    monkeypatch.setattr(audit_module, "TopicReader", reader)
    return readers


def _source(offset: int) -> dict[str, Any]:
    return {"topic": TOPICS.input, "partition": 0, "offset": offset}


def _call(offset: int, batch: str, turn: int = 1, ordinal: int = 0) -> dict[str, Any]:
    return {
        "call_id": f"{TOPICS.input}/0/{offset}/moderateComment/{ordinal}/{turn}",
        "tool": "moderateComment",
        "instance": f"i{offset}",
        "call": {"_tool": "moderateComment", "_instance": f"i{offset}"},
        "source": _source(offset),
        "batch": {"id": batch, "size": 1, "token": "①", "attempt": 1},
        "turn": turn,
    }


def _no_action(offset: int, batch: str) -> dict[str, Any]:
    return {
        "instance": f"i{offset}",
        "reason": "fine",
        "source": _source(offset),
        "batch": {"id": batch, "size": 1, "token": "①", "attempt": 1},
    }


async def _audit(
    monkeypatch: pytest.MonkeyPatch, inputs: int, outcomes: dict[str, list[dict[str, Any]]]
) -> AuditReport:
    topics: dict[str, list[_Rec]] = {
        TOPICS.input: [_Rec(0, i, b"{}") for i in range(inputs)],
        **{
            t: [_Rec(0, k, orjson.dumps(v)) for k, v in enumerate(recs)]
            for t, recs in outcomes.items()
        },
    }
    readers = _patch_reader(monkeypatch, topics)
    report = await audit("unused:9092", TOPICS, [TOOL])
    assert len(readers) == 1 and not readers[0].open  # every topic read through one reader
    return report


async def test_each_input_decided_once_is_one_outcome(monkeypatch: pytest.MonkeyPatch) -> None:
    # Two calls of one decision, a no-action, and a workflow's two turns (two batches).
    report = await _audit(
        monkeypatch,
        3,
        {
            TOOL: [
                _call(0, "w1-1"),
                _call(0, "w1-1", ordinal=1),
                _call(2, "w1-1"),
                _call(2, "w1-7", turn=2),
            ],
            TOPICS.no_action: [_no_action(1, "w1-1")],
        },
    )
    assert report.unaccounted == 0
    assert report.outcomes_per_input_max == 1 and report.duplicate_outcomes == 0


async def test_a_call_and_a_no_action_from_two_runs_are_two_outcomes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # No record repeats another: counting copies saw nothing wrong here.
    report = await _audit(
        monkeypatch, 1, {TOOL: [_call(0, "w1-1")], TOPICS.no_action: [_no_action(0, "w2-1")]}
    )
    assert report.duplicate_calls == 0
    assert report.outcomes_per_input_max == 2 and report.duplicate_outcomes == 1


async def test_a_redone_decision_and_a_repeated_record_each_count(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Input 0 redone by another run (same call_id, another batch); input 1's record
    # written twice by one decision.
    report = await _audit(
        monkeypatch,
        2,
        {TOOL: [_call(0, "w1-1"), _call(0, "w2-3"), _call(1, "w1-1"), _call(1, "w1-1")]},
    )
    assert report.duplicate_calls == 2
    assert report.outcomes_per_input_max == 2 and report.duplicate_outcomes == 2


async def test_a_dead_letter_of_another_run_is_another_outcome(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    letter = {
        "code": "unanswered",
        "reason": "never answered",
        "scope": "item",
        "instance": "i0",
        "source": _source(0),
        "batch_id": "w2-4",
    }
    report = await _audit(monkeypatch, 1, {TOOL: [_call(0, "w1-1")], TOPICS.dead_letter: [letter]})
    assert report.outcomes_per_input_max == 2 and report.duplicate_outcomes == 1


async def test_a_context_message_forwarded_from_the_input_topic_is_its_outcome(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    forwarded = _Rec(0, 0, b'{"type": "plan"}', key=b"plan")
    forwarded.headers = (("stream-forwarded-from", f"{TOPICS.input}/0/1".encode()),)
    by_ops = _Rec(0, 1, b'{"type": "advisor"}', key=b"a")  # written there directly
    topics: dict[str, list[_Rec]] = {
        TOPICS.input: [_Rec(0, i, b"{}") for i in range(2)],
        TOOL: [_Rec(0, 0, orjson.dumps(_call(0, "w1-1")))],
        TOPICS.context: [forwarded, by_ops],
    }
    _patch_reader(monkeypatch, topics)
    report = await audit("unused:9092", TOPICS, [TOOL])
    assert report.unaccounted == 0 and report.context_forwarded == 1
    assert report.unexpected == 0 and report.outcomes_per_input_max == 1
    # the same input forwarded twice is a duplicate outcome
    topics[TOPICS.context] = [forwarded, forwarded]
    report = await audit("unused:9092", TOPICS, [TOOL])
    assert report.duplicate_outcomes == 1
