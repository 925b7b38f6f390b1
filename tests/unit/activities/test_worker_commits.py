"""The activities worker's commit: a group that moved under the worker is ridden out
(the worker rejoins at its next fetch); any other refusal still ends it."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiokafka.errors import (
    CommitFailedError,
    GroupAuthorizationFailedError,
    IllegalStateError,
    UnknownMemberIdError,
)
from instanced_stream.activities.worker import Activities


class _Consumer:
    def __init__(self, error: Exception | None) -> None:
        self.error, self.commits = error, 0

    async def commit(self) -> None:
        self.commits += 1
        if self.error is not None:
            raise self.error


@pytest.mark.parametrize(
    "error",
    [
        CommitFailedError("Commit cannot be completed since the group has already rebalanced"),
        UnknownMemberIdError(),
        IllegalStateError("No partitions assigned"),
    ],
)
async def test_a_commit_the_group_refuses_is_counted_not_raised(
    error: Exception, caplog: pytest.LogCaptureFixture
) -> None:
    worker = Activities()
    await worker._commit(_Consumer(error), handled=5)
    assert worker.refused_commits == 1
    assert "the group moved on before the commit of 5 calls" in caplog.text


async def test_a_commit_refused_for_another_reason_still_ends_the_worker() -> None:
    worker = Activities()
    with pytest.raises(GroupAuthorizationFailedError):
        await worker._commit(_Consumer(GroupAuthorizationFailedError()), handled=1)
    assert worker.refused_commits == 0
    await worker._commit(_Consumer(None), handled=1)
    assert worker.refused_commits == 0


class _Closing:
    """A client whose stop takes a while (the window a repeated cancellation hits)."""

    def __init__(self) -> None:
        self.started, self.stopping = asyncio.Event(), asyncio.Event()
        self.stopped = False

    async def start(self) -> None:
        self.started.set()

    async def getmany(self, **_: object) -> dict[object, list[object]]:
        await asyncio.sleep(0.01)
        return {}

    async def stop(self) -> None:
        self.stopping.set()
        await asyncio.sleep(0.5)
        self.stopped = True


async def test_a_cancellation_during_the_consumer_stop_still_stops_the_producer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Cancelled, then cancelled again while its consumer closes (the demo's Ctrl-C
    cancels each second): the consumer's stop is cut short, but the producer is still
    stopped, not left `Unclosed`."""
    from instanced_stream.activities import worker as module
    from instanced_stream.settings import Settings

    consumer, publisher = _Closing(), _Closing()
    monkeypatch.setattr(
        "instanced_stream.activities.worker.clients.consumer", lambda *_, **__: consumer
    )
    monkeypatch.setattr(module, "Publisher", lambda *_, **__: publisher)
    registry = Activities()

    @registry.activity("moderateComment")
    async def handle(*_: Any) -> None:
        return None

    spec = module.spec_of_handlers(registry)
    task = asyncio.create_task(registry.run(Settings(), spec, "127.0.0.1:1", asyncio.Event()))
    await publisher.started.wait()
    task.cancel()
    await consumer.stopping.wait()
    task.cancel()  # again, mid-close
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not consumer.stopped  # its stop was cut short
    assert publisher.stopping.is_set()  # and the producer's still ran
