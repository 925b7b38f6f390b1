"""When a failed partition is opened again, and when a partition that keeps failing stops
the process (runtime/units/opening.py, `Failures`)."""

from __future__ import annotations

import pytest
from aiokafka.errors import (
    KafkaTimeoutError,
    TopicAuthorizationFailedError,
    UnknownTopicOrPartitionError,
)
from instanced_stream.runtime.units.opening import (
    BROKER_PATIENCE_S,
    MAX_FAILURES,
    Failures,
    PartitionFailing,
)
from instanced_stream.runtime.units.unit import Unit

from tests.fakes import FakeProducer


def test_a_failure_waits_a_back_off_that_doubles() -> None:
    failures, now = Failures(), 100.0
    assert failures.failed(0, RuntimeError("bug"), now) == now + 0.5
    assert failures.failed(0, RuntimeError("bug"), now) == now + 1.0
    assert failures.failed(0, RuntimeError("bug"), now) == now + 2.0


def test_the_back_off_has_a_cap() -> None:
    failures = Failures()
    waits = [failures.failed(1, KafkaTimeoutError(), 0.0) for _ in range(10)]
    assert waits[-1] == 10.0 and waits == sorted(waits)


def test_a_partition_failing_again_and_again_stops_the_process() -> None:
    failures = Failures()
    for _ in range(MAX_FAILURES - 1):
        failures.failed(3, RuntimeError("bug"), 0.0)
    with pytest.raises(PartitionFailing, match=f"partition 3 failed {MAX_FAILURES} times"):
        failures.failed(3, RuntimeError("bug"), 0.0)


def test_the_brokers_own_errors_are_waited_out_for_a_bounded_time() -> None:
    failures = Failures()
    for second in range(0, int(BROKER_PATIENCE_S), 10):  # an outage: waited out
        failures.failed(1, KafkaTimeoutError(), float(second))
    for _ in range(MAX_FAILURES - 1):  # past the patience, they count
        failures.failed(1, KafkaTimeoutError(), BROKER_PATIENCE_S)
    with pytest.raises(PartitionFailing, match="partition 1 failed 5 times in a row"):
        failures.failed(1, KafkaTimeoutError(), BROKER_PATIENCE_S + 1)


@pytest.mark.parametrize("error", [TopicAuthorizationFailedError(), UnknownTopicOrPartitionError()])
def test_a_fatal_broker_error_counts_at_once(error: Exception) -> None:
    failures = Failures()
    for _ in range(MAX_FAILURES - 1):
        failures.failed(4, error, 0.0)
    with pytest.raises(PartitionFailing, match=type(error).__name__):
        failures.failed(4, error, 0.0)


def test_a_commit_in_between_starts_the_count_again() -> None:
    failures = Failures()
    for _ in range(3 * MAX_FAILURES):
        failures.failed(2, RuntimeError("bug"), 0.0)
        healthy = Unit(2, FakeProducer(), group_id="g", transactional=True)
        healthy.commits = 1
        failures.healthy(2, healthy)
    assert failures.failed(2, RuntimeError("bug"), 0.0) == 0.5  # the first of a new run
