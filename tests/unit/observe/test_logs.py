from __future__ import annotations

import logging

import orjson
import pytest
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


def test_coordinator_discoveries_are_debug_lines(caplog: pytest.LogCaptureFixture) -> None:
    from instanced_stream.observe.logs import quiet_library_chatter

    quiet_library_chatter()
    sender = logging.getLogger("aiokafka.producer.sender")
    # on the sender's own logger: a command run earlier in this process may have set
    # "aiokafka" to CRITICAL (quiet commands do), which would hide both lines
    with caplog.at_level(logging.INFO, logger="aiokafka.producer.sender"):
        sender.info("Discovered coordinator %s for transactional id %s", 1, "stream-p0")
        sender.info("Something else %s", "kept")
    assert [r.getMessage() for r in caplog.records] == ["Something else kept"]
    caplog.clear()
    # shown where the root logger is at DEBUG (the filter asks it), once the sender passes it
    with (
        caplog.at_level(logging.DEBUG),
        caplog.at_level(logging.DEBUG, logger="aiokafka.producer.sender"),
    ):
        sender.info("Discovered coordinator %s for transactional id %s", 1, "stream-p0")
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("DEBUG", "Discovered coordinator 1 for transactional id stream-p0")
    ]


def test_the_http_clients_request_lines_are_debug_lines(caplog: pytest.LogCaptureFixture) -> None:
    """openai's and the registry client's HTTP client logs each request at INFO: a line
    per model request in the processor's log, 30 at a start with registry outputs."""
    from instanced_stream.observe.logs import quiet_library_chatter

    quiet_library_chatter()
    http = logging.getLogger("httpx2")
    with caplog.at_level(logging.INFO, logger="httpx2"):
        http.info('HTTP Request: %s %s "%s"', "POST", "http://sim/v1/chat/completions", "200 OK")
        http.warning("Retrying %s", "kept")
    assert [r.getMessage() for r in caplog.records] == ["Retrying kept"]
