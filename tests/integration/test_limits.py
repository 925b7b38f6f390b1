"""Records at the broker's limits, on the real broker: a huge key never crash-loops the
worker, and its dead letter fits."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import orjson
import pytest

from tests.conftest import Deployment

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

Deploy = Callable[..., Awaitable[Deployment]]


async def test_a_200_kb_key_is_dead_lettered_small_and_the_stream_goes_on(
    deploy: Deploy,
) -> None:
    dep = await deploy()
    huge = b"k" * 200_000
    await dep.produce([(huge, orjson.dumps({"comment": "no _instance: the key is the id"}))])
    await dep.produce_items([{"_instance": "after", "comment": "a fine remark"}])
    report = await dep.settle(2)
    assert report.unaccounted == 0
    assert dep.proc.proc is not None and dep.proc.proc.poll() is None  # alive, not looping
    letters = await dep.records(dep.settings.topics.dead_letter)
    assert [d["code"] for d in letters] == ["no_instance"]
    assert len(orjson.dumps(letters[0])) < 100_000  # the key is not copied whole
    assert letters[0]["source"]["key"].endswith("(200000 bytes)")
    calls = await dep.records(dep.activity_topic("moderateComment"))
    assert [c["instance"] for c in calls] == ["after"]
    assert len(calls[0]["call_id"]) < 200
