"""A fenced producer's uncollected transaction outcome is reported at DEBUG; every other
unretrieved exception still reaches the loop's handler as before."""

from __future__ import annotations

import asyncio
import gc
import logging
from typing import Any

import pytest
from aiokafka.errors import KafkaTimeoutError, ProducerFenced
from instanced_stream.kafka.fenced import quiet_fenced_transactions


def _dropped(loop: asyncio.AbstractEventLoop, exc: BaseException) -> None:
    """A future set to `exc` and dropped unread, as aiokafka drops a fenced producer's
    transaction outcome: asyncio reports it when the future is collected."""
    fut = loop.create_future()
    fut.set_exception(exc)
    del fut
    gc.collect()


def test_a_fenced_transaction_is_reported_at_debug(caplog: pytest.LogCaptureFixture) -> None:
    loop = asyncio.new_event_loop()
    try:
        quiet_fenced_transactions(loop)
        with caplog.at_level(logging.DEBUG):
            _dropped(loop, ProducerFenced())
        levels = {(r.name, r.levelname) for r in caplog.records}
        assert ("stream.unit", "DEBUG") in levels
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
    finally:
        loop.close()


def test_other_reports_reach_the_handler_before_it() -> None:
    loop = asyncio.new_event_loop()
    seen: list[dict[str, Any]] = []
    try:
        loop.set_exception_handler(lambda _, context: seen.append(context))
        quiet_fenced_transactions(loop)
        _dropped(loop, KafkaTimeoutError())
        _dropped(loop, ProducerFenced())
        loop.call_exception_handler({"message": "something else", "exception": ProducerFenced()})
    finally:
        loop.close()
    assert [type(c["exception"]).__name__ for c in seen] == ["KafkaTimeoutError", "ProducerFenced"]
    assert seen[1]["message"] == "something else"


def test_without_a_handler_before_it_the_default_reports(
    caplog: pytest.LogCaptureFixture,
) -> None:
    loop = asyncio.new_event_loop()
    try:
        quiet_fenced_transactions(loop)
        with caplog.at_level(logging.ERROR, logger="asyncio"):
            _dropped(loop, KafkaTimeoutError())
    finally:
        loop.close()
    assert "Future exception was never retrieved" in caplog.text
