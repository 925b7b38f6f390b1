from __future__ import annotations

from dataclasses import dataclass

import orjson
import pytest
from instanced_stream.core.messages import (
    ActivityRecord,
    AdviceRecord,
    BatchRef,
    Call,
    DeadLetter,
    DoneRecord,
    SourcePosition,
)
from instanced_stream.ops.console import (
    TopicRow,
    format_record,
    parse_lines,
    render_topics,
    resolve_topic,
)
from instanced_stream.settings import Settings

SOURCE = SourcePosition(topic="p.items", partition=2, offset=1042, key="c-42")
BATCH = BatchRef(id="b-1", size=3, token="①", attempt=1)
# 2025-01-02 03:04:05.678 UTC
TS = 1735787045678


@dataclass
class Rec:
    """The attributes of aiokafka's ConsumerRecord that the formatter reads."""

    value: bytes | None
    key: bytes | None = b"c-42"
    topic: str = "p.items"
    partition: int = 2
    offset: int = 7
    timestamp: int = TS


def _line(value: bytes | None, key: bytes | None = b"c-42") -> str:
    return format_record(Rec(value, key))


def test_parse_lines_keys_invalid_and_blank_lines() -> None:
    text = (
        b'{"_instance": "a-1", "comment": "hi"}\n'
        b"\n"
        b"{not json\n"
        b'  {"comment": "no id"}  \n'
        b"[1, 2]\n"
        b'{"_instance": 17, "id": "x"}\n'
        b'{"_instance": true}\n'
    )
    lines = list(parse_lines(text.splitlines(keepends=True)))
    assert [line.number for line in lines] == [1, 3, 4, 5, 6, 7]  # the blank line is skipped
    assert [line.key for line in lines] == ["a-1", None, None, None, "17", None]
    assert [line.error is None for line in lines] == [True, False, True, False, True, True]
    assert lines[1].error is not None and lines[1].error.startswith("not JSON: ")
    assert lines[1].error.endswith(" at column 2")  # within the line; its number is apart
    assert lines[3].error == "JSON list, not an object"
    assert lines[2].value == b'{"comment": "no id"}'  # stripped, otherwise the line's bytes
    assert lines[0].value == b'{"_instance": "a-1", "comment": "hi"}'
    by_id = list(parse_lines([b'{"_instance": "a", "id": "x-9"}'], key_field="id"))
    assert by_id[0].key == "x-9"


def test_activity_record_line_puts_tool_instance_and_arguments_first() -> None:
    call = Call.model_validate(
        {
            "_tool": "moderateComment",
            "_instance": "c-42",
            "_reasoningForCall": "fine",
            "decision": "approve",
            "reason": "within the rules",
        }
    )
    rec = ActivityRecord(
        call_id="p.items/2/1042/moderateComment/0",
        tool="moderateComment",
        instance="c-42",
        call=call,
        source=SOURCE,
        batch=BATCH,
        model="sim",
        advice={"option": "approve", "score": 0.9},
    )
    line = _line(rec.model_dump_json(by_alias=True).encode())
    assert line == (
        "2025-01-02 03:04:05.678  2:7  c-42  activity tool=moderateComment instance=c-42 "
        'decision=approve reason="within the rules" advice=approve'
    )


def test_dead_letter_advice_and_done_lines() -> None:
    dead = DeadLetter(
        code="not_json", reason="record value is not JSON", scope="item", source=SOURCE
    )
    assert _line(dead.model_dump_json().encode(), key=None).endswith(
        '  -  deadletter code=not_json reason="record value is not JSON" source=p.items/2/1042'
    )
    advice = AdviceRecord(
        instance="c-42",
        source=SOURCE,
        batch=BATCH,
        opinions=[],
        consensus={"option": "reject", "score": 0.75},
        divergent=True,
    )
    assert _line(advice.model_dump_json().encode()).endswith(
        "  advice instance=c-42 option=reject score=0.75 divergent=true"
    )
    done = DoneRecord(instance="t-1", status="turn_limit", turns=3, state={}, trace=[])
    assert _line(done.model_dump_json().encode()).endswith(
        "  done instance=t-1 status=turn_limit turns=3"
    )


def test_unknown_non_json_and_tombstone_values_never_crash() -> None:
    assert _line(b'{"_instance": "c-1", "comment": "hi"}').endswith(
        '  {"_instance":"c-1","comment":"hi"}'
    )
    assert _line(b"\xff\x00oops\nnext", key=b"\x01k").endswith(
        "  \\x01k  (not JSON) \\xff\\x00oops\\nnext"
    )
    assert _line(None).endswith("  c-42  (tombstone)")
    assert len(_line(orjson.dumps({"text": "x" * 1000}))) < 300


def test_json_lines_are_envelopes_one_per_line() -> None:
    out = orjson.loads(format_record(Rec(b'{"a": [1, 2]}'), as_json=True))
    assert out == {
        "topic": "p.items",
        "partition": 2,
        "offset": 7,
        "timestamp_ms": TS,
        "key": "c-42",
        "value": {"a": [1, 2]},
    }
    raw = format_record(Rec(b"not json\n", key=None), as_json=True)
    assert "\n" not in raw
    assert orjson.loads(raw)["raw"] == "not json\n"
    assert orjson.loads(raw)["key"] is None


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("items", "p.items"),
        ("input", "p.items"),
        ("deadletter", "p.stream.deadletter"),
        ("stream.done", "p.stream.done"),
        ("advice", "p.stream.advice"),
        ("activity.moderateComment", "p.activity.moderateComment"),
        ("changelog", "p.instanced-stream-state-changelog"),
        ("p.stream.review", "p.stream.review"),
        ("somebody.elses", "somebody.elses"),
    ],
)
def test_resolve_topic(name: str, expected: str) -> None:
    assert resolve_topic(Settings(topic_prefix="p."), name) == expected


def test_render_topics_aligns_columns_and_shows_lag() -> None:
    rows = [
        TopicRow("p.items", 2, 10, group="p.app", committed=None, lag={0: 4, 1: 6}),
        TopicRow("p.stream.deadletter", 4, 0, created=True),
        TopicRow("p.stream.done", 0, 0),
    ]
    lines = render_topics(rows).splitlines()
    assert lines[0].split() == ["topic", "partitions", "records", "lag"]
    assert lines[1].split()[:4] == ["p.items", "2", "10", "10"]
    assert "no group p.app yet" in lines[1]
    assert "lag by partition 0:4 1:6" in lines[1]
    assert lines[2].endswith("created")
    assert "missing" in lines[3]
    # numbers are right-aligned under their header: 10, 0 and 0 end in the same column
    end = lines[0].index("records") + len("records")
    assert [line[end - 1 : end + 1] for line in lines[1:]] == ["0 ", "0 ", "0 "]
    committed = TopicRow("p.items", 1, 5, group="p.app", committed={0: 3}, lag={0: 2})
    assert "group p.app, lag by partition 0:2" in render_topics([committed])
