"""Issue 24, item 7, on the real broker: an item that makes the endpoint answer 500 is
split out of its batch and dead-lettered `llm_error`; its batch-mates and the batches
behind it are published (before, 5xx was retried for ever and the batch order gate held
every later batch behind it)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest

from tests.conftest import Deployment

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

Deploy = Callable[..., Awaitable[Deployment]]


async def test_a_5xx_poison_item_is_dead_lettered_and_the_rest_flows(deploy: Deploy) -> None:
    dep = await deploy()
    items = [{"_instance": f"p-{i:03d}", "comment": f"a fine remark {i}"} for i in range(40)]
    items[7]["comment"] += " [[sim:error500]]"
    await dep.produce_items(items)
    report = await dep.settle(40, wait_s=120)
    assert report.unaccounted == 0, report
    assert report.dead_letters == {"llm_error": 1}, report
    assert report.calls_by_tool["moderateComment"] == 39
    (letter,) = await dep.records(dep.settings.topics.dead_letter)
    assert letter["code"] == "llm_error" and letter["instance"] == "p-007"
    assert "500" in letter["reason"]
