"""The activities worker's commit: a group that moved under the worker is ridden out
(the worker rejoins at its next fetch); any other refusal still ends it."""

from __future__ import annotations

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
