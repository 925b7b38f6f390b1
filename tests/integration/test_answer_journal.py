"""An answer is never paid twice (runtime/pipeline/journal.py), on a real broker with a
processor that is a real OS process and the simulator over HTTP: a processor killed
after its batch's answer came back and before anything of it committed leaves the
answers in the journal, and its restart's redo asks the model nothing for those items,
while every item still ends exactly once; and a partition that moves in a graceful
rebalance while its items' request is in flight is not asked again by its new owner."""

from __future__ import annotations

import asyncio
import re
import signal
import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
import pytest
from instanced_stream.kafka.topics import answer_journal, partitions, read_changelog
from instanced_stream_bench.harness.demo import ProcessorProcess
from instanced_stream_bench.harness.paid_twice import journaled_twice

from tests.conftest import Deployment, committed_offsets
from tests.integration.test_rebalance import _port, _ready

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(300)]

Deploy = Callable[..., Awaitable[Deployment]]
ITEMS = 24


async def _journal(dep: Deployment) -> dict[str, bytes]:
    topic = answer_journal(dep.settings)
    found: dict[str, bytes] = {}
    for p in await partitions(dep.bootstrap, topic):
        found.update(await read_changelog(dep.bootstrap, topic, p))
    return found


async def _killed(dep: Deployment, wait_s: float) -> int | None:
    assert dep.proc.proc is not None
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if dep.proc.proc.poll() is not None:
            break
        await asyncio.sleep(0.1)
    return dep.proc.proc.poll()


def _asked(requests: list[list[dict[str, Any]]], texts: dict[str, str]) -> set[str]:
    """The items (by comment) the requests asked about."""
    said = "\n".join(m["content"] for messages in requests for m in messages)
    return {text for text in texts.values() if orjson.dumps(text).decode() in said}


async def test_the_redo_after_a_kill_past_the_answer_asks_nothing_for_journaled_items(
    deploy: Deploy,
) -> None:
    dep = await deploy(STREAM_CRASH_AT="after_llm:1")
    # Slower answers keep the first batch's items together and others in flight.
    dep.sim.config.latency_ms = 150
    items = [
        {"_instance": f"j-{i:03d}", "comment": f"Thanks, a useful note number {i} of the journal."}
        for i in range(ITEMS)
    ]
    positions = await dep.produce_items(items)
    text_at = {
        f"{dep.settings.topics.input}/{p}/{o}/1": str(it["comment"])
        for (p, o), it in zip(positions, items, strict=True)
    }
    assert await _killed(dep, 90) == -signal.SIGKILL, dep.proc.tail()
    assert "SIGKILL at after_llm (hit 1)" in dep.proc.tail(400)
    # The precondition: the killed batch's answers came back and were journaled, and
    # nothing of the run committed (the first batch to reach that point was killed).
    journaled = await _journal(dep)
    print(f"{len(journaled)} answers journaled when the processor was killed")
    assert journaled and set(journaled) <= set(text_at), sorted(journaled)[:3]
    assert all(o == 0 for o in (await committed_offsets(dep.bootstrap, dep.settings)).values())
    seen_before = dep.sim.seen_total
    asked_before = dep.sim.stats["instances"]
    dep.proc.env.pop("STREAM_CRASH_AT")
    dep.proc.start()  # the supervisor's restart: the group redoes from the last commit
    report = await dep.settle_quiet(ITEMS, wait_s=150)
    assert report.unaccounted == 0 and report.unexpected == 0, report.summary()
    assert report.duplicate_calls == 0 and report.outcomes_per_input_max == 1
    new = dep.sim.seen_total - seen_before
    # No new request at all when every item of the run was in the killed batch and so
    # journaled: the redo answers them all from the journal.
    assert 0 <= new <= len(dep.sim.seen)
    assert new > 0 or len(journaled) == ITEMS, (new, len(journaled))
    redo = list(dep.sim.seen)[len(dep.sim.seen) - new :]  # [-0:] would be all of them
    asked_again = _asked(redo, {k: text_at[k] for k in journaled})
    assert asked_again == set(), sorted(asked_again)[:3]
    # Every other item was asked once more (the killed run's others, and those never asked).
    assert dep.sim.stats["instances"] - asked_before == ITEMS - len(journaled)
    log = dep.proc.log_path.read_text(errors="replace")
    taken = re.findall(r"(\d+) answers taken from the journal", log)
    assert sum(int(n) for n in taken) == len(journaled)
    # Each entry left with its outcome's transaction.
    assert await _journal(dep) == {}


async def test_a_partition_moved_by_a_join_is_not_asked_again_while_its_answer_is_in_flight(
    deploy: Deploy,
) -> None:
    """The old owner's batch in flight when a member joins: its answers must reach the
    new owner (committed before the move, or journaled before the new owner reads the
    journal), never be asked for again by it."""
    # A revocation waits up to half the session timeout: 8 s covers what is left of the
    # 6 s answer when the second member joins, with room for a loaded machine.
    dep = await deploy(STREAM_SESSION_TIMEOUT_S="16")
    port = _port()
    second = ProcessorProcess(
        {**dep.proc.env, "STREAM_WEB_PORT": str(port)},
        dep.proc.log_path.with_name("second.log"),
    )
    dep.extra = [second]
    await _ready(dep.web, 4)
    probes, asked_before = dep.sim.stats["probes"], dep.sim.stats["instances"]
    again_before = dep.sim.stats["items_asked_again"]
    second.start()
    deadline = time.monotonic() + 60
    while dep.sim.stats["probes"] == probes:  # its start-up probe, answered at once
        assert time.monotonic() < deadline, second.tail()
        await asyncio.sleep(0.05)
    # From now on an answer takes longer than the second member needs to join: the
    # first member's batch is in flight when the group revokes its partitions.
    dep.sim.config.latency_ms = 6000
    items = [
        {"_instance": f"m-{i:03d}", "comment": f"A kind word, number {i}, about the move."}
        for i in range(ITEMS)
    ]
    await dep.produce_items(items)
    in_flight_at_revoke: int | None = None
    while in_flight_at_revoke is None:
        assert time.monotonic() < deadline + 30, dep.proc.tail()
        # aiokafka's line, written before the revocation's callback runs (an empty
        # `set()` at the first join).
        if "Revoking previously assigned partitions frozenset" in dep.proc.log_path.read_text():
            in_flight_at_revoke = dep.sim.seen_total - dep.sim.stats["completions"]
        await asyncio.sleep(0.05)
    await _ready(f"http://127.0.0.1:{port}", 2)
    report = await dep.settle_quiet(ITEMS, wait_s=150)
    assert report.unaccounted == 0 and report.unexpected == 0, report.summary()
    assert report.duplicate_calls == 0 and report.outcomes_per_input_max == 1
    # The precondition: the first member's request was in flight when it was revoked.
    assert in_flight_at_revoke >= 1, dep.proc.tail(60)
    twice = await journaled_twice(dep.bootstrap, answer_journal(dep.settings))
    again = dep.sim.stats["items_asked_again"] - again_before
    print(f"moved in flight: answers_paid_twice {twice}, items_asked_again {again}")
    assert twice == 0 and again == 0, (twice, again, second.tail(40))
    assert dep.sim.stats["instances"] - asked_before == ITEMS
    assert await _journal(dep) == {}  # each entry left with its outcome's transaction
