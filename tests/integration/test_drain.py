"""Shutdown on the real broker: SIGTERM drains the batches in flight and commits them, so
a rolling update asks the model nothing twice."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import pytest
from instanced_stream_bench.harness.demo import ProcessorProcess
from instanced_stream_bench.testing.broker import free_port

from tests.conftest import Deployment, committed_offsets, with_work

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

Deploy = Callable[..., Awaitable[Deployment]]


async def test_sigterm_drains_batches_in_flight_and_commits_them(deploy: Deploy) -> None:
    dep = await deploy(STREAM_DRAIN_S="20")
    await dep.produce_items([{"_instance": "warm", "comment": "hello"}])
    await dep.settle(1)
    dep.sim.config.latency_ms = 3000  # every answer takes 3 s: SIGTERM comes mid-request
    asked, seen = dep.sim.stats["completions"], dep.sim.stats["requests"]
    items = [{"_instance": f"d-{i:03d}", "comment": f"a fine remark {i}"} for i in range(30)]
    await dep.produce_items(items)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if dep.sim.stats["requests"] > seen:
            break
        await asyncio.sleep(0.1)
    await asyncio.sleep(0.5)
    assert dep.proc.proc is not None
    assert dep.sim.stats["completions"] == asked, "answered before SIGTERM: nothing to drain"
    await asyncio.to_thread(dep.proc.stop, 40)  # SIGTERM, then wait for the exit
    assert dep.proc.proc.returncode == 0, dep.proc.tail()
    assert "drain: every batch in flight was delivered" in dep.proc.tail(200)
    stopped_log = dep.proc.log_path.read_text(errors="replace")
    assert "Unclosed" not in stopped_log and "never retrieved" not in stopped_log
    answered = dep.sim.stats["completions"]
    assert answered > asked
    assert (
        sum((await committed_offsets(dep.bootstrap, dep.settings)).values()) == 31
    )  # all of it, drained
    dep.sim.config.latency_ms = 0
    dep.proc.start()
    report = await dep.settle(31)
    assert report.unaccounted == 0
    assert report.duplicate_calls == 0  # nothing was published twice
    assert dep.sim.stats["completions"] == answered  # and nothing asked twice


async def test_sigterm_while_running_idle_exits_0_and_leaves_no_client_open(
    deploy: Deploy,
) -> None:
    """The running phase: a processor that served its items and waits for more stops on
    SIGTERM with exit 0, its every client closed (the log says nothing `Unclosed`)."""
    dep = await deploy()
    await dep.produce_items([{"_instance": f"r-{i}", "comment": "hello"} for i in range(5)])
    await dep.settle(5)
    assert dep.proc.proc is not None and dep.proc.proc.poll() is None
    await asyncio.to_thread(dep.proc.stop, 40)
    log = dep.proc.log_path.read_text(errors="replace")
    assert dep.proc.proc.returncode == 0, log[-4000:]
    assert "Unclosed" not in log and "never retrieved" not in log, log[-8000:]
    assert "Traceback" not in log, log[-8000:]


@pytest.mark.parametrize("delay_s", [0.0, 0.3, 1.0])
async def test_sigterm_while_joining_stops_cleanly_and_leaves_no_client_open(
    deploy: Deploy, delay_s: float
) -> None:
    """A member stopped while it joins the group (a rollout that gives up on a pod, a
    scale-in right after a scale-out): it exits 0 within its grace, takes no assignment,
    and leaves no client unclosed (the context follower once started its consumer before
    the `try` that stops it)."""
    dep = await deploy()
    joiner = ProcessorProcess(
        {**dep.proc.env, "STREAM_WEB_PORT": str(free_port())},
        dep.proc.log_path.with_name(f"joiner-{delay_s}.log"),
    )
    joiner.start()
    try:
        deadline = time.monotonic() + 60
        while "(Re-)joining group" not in joiner.tail(400):
            assert time.monotonic() < deadline, "the second member never began to join"
            await asyncio.sleep(0.05)
        await asyncio.sleep(delay_s)
        started = time.monotonic()
        await asyncio.to_thread(joiner.stop, 40)
        took = time.monotonic() - started
    finally:
        joiner.kill()
    assert joiner.proc is not None and joiner.proc.returncode == 0, joiner.tail()
    log = joiner.tail(2000)
    assert "Unclosed" not in log, log
    assert took < 30, f"the stop took {took:.1f} s"
    print(f"stopped {delay_s} s into its join in {took:.1f} s")


async def test_a_member_frozen_past_its_session_is_fenced_and_stops_without_stray_errors(
    deploy: Deploy,
) -> None:
    """A processor frozen (SIGSTOP) with a batch at the model for longer than its session
    timeout is replaced: the other member takes its partitions and its transactional
    producers fence the frozen one's. Thawed, the frozen member's commit is fenced, as it
    must be; its stop then logs no `Future exception was never retrieved` (the fenced
    producers' transaction failure, which nobody awaited, was a dozen tracebacks)."""
    dep = await deploy()
    await dep.produce_items([{"_instance": "warm", "comment": "hello"}])
    await dep.settle(1)
    other = ProcessorProcess(
        {**dep.proc.env, "STREAM_WEB_PORT": str(free_port())},
        dep.proc.log_path.with_name("other.log"),
    )
    dep.extra.append(other)
    other.start()
    deadline = time.monotonic() + 60
    while "Successfully synced group" not in other.tail(2000):
        assert time.monotonic() < deadline, other.tail()
        await asyncio.sleep(0.2)
    dep.sim.config.latency_ms = 4000  # the frozen member's batch is at the model
    items = [{"_instance": f"f-{i:03d}", "comment": f"a fine remark {i}"} for i in range(40)]
    await dep.produce_items(items)
    assert await with_work(dep.proc) is not None, "no batch in flight to freeze with"
    assert dep.proc.proc is not None
    with dep.proc.held():  # SIGSTOP: its session (6 s) lapses; the other takes over
        await asyncio.sleep(20)
    dep.sim.config.latency_ms = 0
    # Thawed, its commit cannot succeed: fenced by the member that took its partitions'
    # producers, or (seen once in a full run) refused by its own producer first, whose
    # transaction the coordinator had ended meanwhile ("not in transaction"). Either way
    # the unit fails and its partition is reopened from the last commit.
    deadline = time.monotonic() + 60
    while not any(s in dep.proc.tail(4000).lower() for s in ("fenced", "unit failed")):
        assert time.monotonic() < deadline, dep.proc.tail(200)
        await asyncio.sleep(0.5)
    report = await dep.settle(41)
    assert report.unaccounted == 0
    await asyncio.to_thread(dep.proc.stop, 40)
    log = dep.proc.log_path.read_text(errors="replace")
    assert dep.proc.proc.returncode == 0, log[-4000:]
    assert "never retrieved" not in log, log[-8000:]
    assert "Unclosed" not in log, log[-8000:]
