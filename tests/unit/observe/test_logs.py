from __future__ import annotations

import logging

import orjson
from instanced_stream.observe.logs import JsonFormatter


def test_json_log_lines_carry_batch_and_instance_ids() -> None:
    record = logging.LogRecord(
        "stream.processor", logging.WARNING, __file__, 1, "batch %s failed", ("b-7",), None
    )
    record.batch_id = "b-7"
    record.instance = "c-1"
    line = orjson.loads(JsonFormatter().format(record))
    assert line["message"] == "batch b-7 failed" and line["level"] == "WARNING"
    assert line["batch_id"] == "b-7" and line["instance"] == "c-1"


def test_json_log_lines_have_a_utc_time_and_the_error() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        import sys

        record = logging.LogRecord(
            "stream.x", logging.ERROR, __file__, 1, "failed", (), sys.exc_info()
        )
    record.offset = 42
    line = orjson.loads(JsonFormatter().format(record))
    assert line["logger"] == "stream.x" and line["offset"] == 42
    assert line["ts"].endswith("+00:00") and line["ts"][:4].isdigit()
    assert "ValueError: boom" in line["error"]
    assert set(line) == {"ts", "level", "logger", "message", "offset", "error"}
