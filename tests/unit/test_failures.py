"""When a failed unit is reopened, and when a partition that keeps failing stops the
process (runtime/engine/membership.py, `Failures`)."""

from __future__ import annotations

import pytest
from aiokafka.errors import KafkaTimeoutError
from instanced_stream.runtime.engine.membership import MAX_FAILURES, Failures, PartitionFailing
from instanced_stream.runtime.engine.unit import Unit

from tests.fakes import FakeProducer


def _failed(exc: BaseException) -> Unit:
    unit = Unit(0, FakeProducer(), group_id="g", transactional=True)
    unit.fail(exc)
    return unit


def test_a_failure_waits_a_back_off_that_doubles() -> None:
    failures, now = Failures(), 100.0
    assert not failures.due(0, _failed(RuntimeError("bug")), now)  # counted, waits 0.5 s
    assert not failures.due(0, _failed(RuntimeError("bug")), now + 0.4)
    assert failures.due(0, _failed(RuntimeError("bug")), now + 0.6)
    assert not failures.due(0, _failed(RuntimeError("bug")), now + 1.0)  # second: 1 s
    assert not failures.due(0, _failed(RuntimeError("bug")), now + 1.9)
    assert failures.due(0, _failed(RuntimeError("bug")), now + 2.1)


def test_a_partition_failing_again_and_again_stops_the_process() -> None:
    failures, now = Failures(), 0.0
    for _ in range(MAX_FAILURES - 1):
        assert not failures.due(3, _failed(RuntimeError("bug")), now)
        now += 60
        assert failures.due(3, _failed(RuntimeError("bug")), now)
    last = _failed(RuntimeError("bug"))
    with pytest.raises(PartitionFailing, match=f"partition 3 failed {MAX_FAILURES} times"):
        failures.due(3, last, now)


def test_the_brokers_own_errors_are_waited_out_without_limit() -> None:
    failures, now = Failures(), 0.0
    for _ in range(3 * MAX_FAILURES):
        assert not failures.due(1, _failed(KafkaTimeoutError()), now)
        now += 60
        assert failures.due(1, _failed(KafkaTimeoutError()), now)


def test_a_commit_in_between_starts_the_count_again() -> None:
    failures, now = Failures(), 0.0
    for _ in range(3 * MAX_FAILURES):
        failures.due(2, _failed(RuntimeError("bug")), now)
        now += 60
        assert failures.due(2, _failed(RuntimeError("bug")), now)
        healthy = Unit(2, FakeProducer(), group_id="g", transactional=True)
        healthy.commits = 1
        assert not failures.due(2, healthy, now)
