"""Dead letters re-driven (issue 39): `unanswered` items sent back once the model is fixed
end every item, the audit counting each input once; a re-drive that fails again is not
re-driven in a loop, and running the command twice sends nothing twice."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest
from instanced_stream.kafka.topics import read_topic
from instanced_stream.ops.redrive import REDRIVE, REDRIVE_COUNT, REDRIVE_OF
from instanced_stream_bench.testing.sim.server import Faults

from tests.conftest import Deployment

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

Deploy = Callable[..., Awaitable[Deployment]]
N = 16


async def _letters(dep: Deployment) -> list[dict[str, object]]:
    return [d for d in await dep.records(dep.settings.topics.dead_letter) if d["scope"] == "item"]


async def test_unanswered_items_redriven_after_the_model_is_fixed_end_every_item(
    deploy: Deploy,
) -> None:
    dep = await deploy(STREAM_MAX_ATTEMPTS="2")
    dep.sim.config = dep.sim.config.model_copy(update={"faults": Faults(skip_rate=1.0)})
    items = [{"_instance": f"r-{i:03d}", "comment": f"Post number {i}."} for i in range(N)]
    await dep.produce_items(items)
    report = await dep.settle(N)
    letters = await _letters(dep)
    # The precondition: the broken model left every item unanswered.
    assert [d["code"] for d in letters] == ["unanswered"] * N
    assert report.item_dead_letters == N

    dry = await dep.cli("redrive", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "would send 16, skipped 0" in dry.stdout
    assert len([r async for r in read_topic(dep.bootstrap, dep.settings.topics.input)]) == N

    # Still broken: the re-driven items fail again ...
    sent = await dep.cli("redrive", "--code", "unanswered")
    assert "sent 16, skipped 0" in sent.stdout, sent.stdout + sent.stderr
    report = await dep.settle(N)
    assert report.inputs == N and report.redriven == N and report.item_dead_letters == N
    assert len(await _letters(dep)) == 2 * N
    # ... and are not re-driven again, nor is any dead letter re-driven twice.
    again = await dep.cli("redrive")
    assert "sent 0, skipped 32" in again.stdout, again.stdout + again.stderr
    assert again.stdout.count("re-driven before") == N
    assert again.stdout.count("failed again") == N

    # The model fixed, one more round allowed on purpose: every item ends.
    dep.sim.config = dep.sim.config.model_copy(update={"faults": Faults()})
    fixed = await dep.cli("redrive", "--max-redrives", "2")
    assert "sent 16, skipped 16" in fixed.stdout, fixed.stdout + fixed.stderr
    report = await dep.settle(N)
    assert report.inputs == N and report.unaccounted == 0
    assert report.duplicate_calls == 0 and report.duplicate_outcomes == 0
    assert report.item_dead_letters == 0 and report.redriven == 2 * N
    calls = await dep.records(dep.activity_topic("moderateComment"))
    assert sorted(c["instance"] for c in calls) == [i["_instance"] for i in items]
    # Each re-driven record names the dead letter it re-drives and the first attempt.
    heads = [
        dict(rec.headers)
        async for rec in read_topic(dep.bootstrap, dep.settings.topics.input)
        if rec.headers
    ]
    assert len(heads) == 2 * N
    assert sorted(h[REDRIVE_COUNT] for h in heads) == [b"1"] * N + [b"2"] * N
    assert all(h[REDRIVE].startswith(dep.settings.topics.dead_letter.encode()) for h in heads)
    assert len({h[REDRIVE_OF] for h in heads}) == N
