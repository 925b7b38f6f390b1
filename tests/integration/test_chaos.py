"""The fault campaign's chaos scenarios (issue 5: 1, 2, 3 and 5), each against a real
Apache Kafka broker and a processor that is a real OS process.

1. kill -9 at chosen pipeline points (STREAM_CRASH_AT, testing/faults.py), many runs, in
   both delivery modes;
2. a slow earlier batch and a fast later batch of one partition in flight, then kill -9;
3. an exception inside the batch body;
5. the broker restarted, cleanly and with kill -9 (down for more than three publish
   timeouts), while items flow.

Each checks conservation with the shared auditor (`stream audit`): every item ends as a
call, a no-action or a dead letter. Exactly once: a read_committed reader sees each once,
and never an output whose input offset is not committed. At least once: a redone batch
repeats its `call_id`s, and only those published but not committed come again.
"""

from __future__ import annotations

import asyncio
import os
import random
import secrets
import signal
import socket
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from instanced_stream.ops.audit import AuditReport
from instanced_stream_bench.harness.demo import ProcessorProcess, launch_processor
from instanced_stream_bench.testing.broker import LocalKafka
from instanced_stream_bench.testing.sim.server import Faults, Simulator

from tests.conftest import Deployment, committed_offsets

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(300)]

Deploy = Callable[..., Awaitable[Deployment]]
KILL_POINTS = ("after_llm", "mid_commit", "after_commit")
# Scenario 1: runs (each a kill at a random pass of one point) and items per run. Each
# restart waits out the dead member's session (6 s), which dominates a run's time; CI
# keeps to one run per point, STREAM_CHAOS_RUNS asks for more.
RUNS = int(os.environ.get("STREAM_CHAOS_RUNS") or 3)
PER_RUN = 100


def _items(n: int, tag: str, extra: str = "") -> list[dict[str, Any]]:
    return [
        {"_instance": f"{tag}-{i:04d}", "comment": f"Thanks, a useful note {tag} {i}. {extra}"}
        for i in range(n)
    ]


def _seed() -> int:
    """Random per session so runs cover different moments; printed to replay a failure."""
    seed = int(os.environ.get("STREAM_CHAOS_SEED") or secrets.randbits(32))
    print(f"chaos seed {seed} (replay: STREAM_CHAOS_SEED={seed})")
    return seed


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def _exit_code(proc: ProcessorProcess, wait_s: float) -> int | None:
    assert proc.proc is not None
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if proc.proc.poll() is not None:
            break
        await asyncio.sleep(0.1)
    return proc.proc.poll()


async def _calls(dep: Deployment) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for tool in ("moderateComment", "notifyAuthor"):
        out += await dep.records(dep.activity_topic(tool))
    return out


def _partition(call: dict[str, Any]) -> int:
    return int(call["source"]["partition"])


def _offset(call: dict[str, Any]) -> int:
    return int(call["source"]["offset"])


def _same_call_same_item(calls: list[dict[str, Any]]) -> None:
    """A call_id names one item's call: every copy has its instance and source."""
    seen: dict[str, tuple[str, int, int]] = {}
    for rec in calls:
        src = rec["source"]
        where = (rec["instance"], src["partition"], src["offset"])
        assert seen.setdefault(rec["call_id"], where) == where, rec["call_id"]


def _assert_conserved(report: AuditReport) -> None:
    assert report.unaccounted == 0, (report.summary(), report.missing[:5])
    assert report.unexpected == 0
    assert report.item_dead_letters == 0, report.dead_letters


# ----------------------------------------------------------------------------- 1


@pytest.mark.parametrize("delivery", ["exactly_once", "at_least_once"])
async def test_kill_9_at_chosen_points_loses_nothing(deploy: Deploy, delivery: str) -> None:
    rng = random.Random(_seed())
    plan = [(KILL_POINTS[k % len(KILL_POINTS)], rng.randint(1, 4)) for k in range(RUNS)]
    print(f"kill plan (point, pass): {plan}")
    dep = await deploy(STREAM_CRASH_AT=f"{plan[0][0]}:{plan[0][1]}", STREAM_DELIVERY=delivery)
    # Slower answers keep several batches in flight, so a kill also catches the others
    # at different stages.
    dep.sim.config.latency_ms = 150
    produced = 0
    kills: list[tuple[str, Counter[str], dict[int, int]]] = []  # point, calls, commit
    for run, (point, nth) in enumerate(plan):
        if run:
            dep.proc.env["STREAM_CRASH_AT"] = f"{point}:{nth}"
            dep.proc.start()  # the same group: it redoes what the dead one left open
        await dep.produce_items(_items(PER_RUN, f"r{run}"))
        produced += PER_RUN
        code = await _exit_code(dep.proc, 90)
        assert code == -signal.SIGKILL, f"run {run}: {point}:{nth} never fired\n{dep.proc.tail()}"
        fired = dep.proc.log_path.read_text(errors="replace").count("fault injection: SIGKILL at")
        assert fired == run + 1
        assert f"SIGKILL at {point} (hit {nth})" in dep.proc.tail(400)
        seen = Counter(rec["call_id"] for rec in await _calls(dep))
        commit = await committed_offsets(dep.bootstrap, dep.settings)
        if delivery == "exactly_once":
            # Outputs and offsets commit together: nothing visible past the commit.
            past = [c for c in await _calls(dep) if _offset(c) >= commit.get(_partition(c), 0)]
            assert not past, f"run {run}: outputs past the committed offsets: {past[:3]}"
        kills.append((point, seen, commit))
    dep.proc.env.pop("STREAM_CRASH_AT")
    dep.proc.start()
    report = await dep.settle_quiet(produced, wait_s=120)
    print(f"{len(kills)} kills, each at its point with a batch's outputs unsent or uncommitted")
    _assert_conserved(report)
    calls = await _calls(dep)
    _same_call_same_item(calls)
    moderated = {r["instance"] for r in calls if r["tool"] == "moderateComment"}
    assert moderated == {f"r{k}-{i:04d}" for k in range(RUNS) for i in range(PER_RUN)}
    final = Counter(rec["call_id"] for rec in calls)
    assert report.duplicate_calls == sum(final.values()) - len(final)
    if delivery == "exactly_once":
        assert report.duplicate_calls == 0
        assert report.outcomes_per_input_max == 1, report.duplicate_outcomes
        return
    where = {r["call_id"]: (r["source"]["partition"], r["source"]["offset"]) for r in calls}
    for k, (point, seen, commit) in enumerate(kills):
        # Published before this kill but not committed: exactly these were published
        # again later (by whichever process got that far), under the same call_id.
        uncommitted = {c for c in seen if where[c][1] >= commit.get(where[c][0], 0)}
        again = {c for c in seen if final[c] > seen[c]}
        print(f"kill {k} at {point}: {len(uncommitted)} published calls uncommitted, redone")
        assert again == uncommitted, (k, point, sorted(again ^ uncommitted)[:5])
        if point == "mid_commit":
            # Killed with a commit's records acknowledged, its offsets not: they come again.
            assert uncommitted, f"kill {k} at {point} left no published call uncommitted"


# ----------------------------------------------------------------------------- 2


async def test_slow_earlier_batch_holds_the_commit_and_is_redone_after_kill_9(
    deploy: Deploy, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One partition: the slow and the fast batch are the same partition's records.
    monkeypatch.setenv("STREAM_PARTITIONS", "1")
    dep = await deploy()
    assert dep.settings.partitions == 1
    await dep.produce_items(_items(10, "pre"))
    await dep.settle(10)
    for _ in range(60):  # the prefix is done and committed
        if (await committed_offsets(dep.bootstrap, dep.settings)).get(0) == 10:
            break
        await asyncio.sleep(0.25)
    slow_s = 10.0
    await dep.produce_items(_items(2, "slow", f"[[sim:slow={slow_s:g}]]"))  # offsets 10, 11
    sent = time.monotonic()
    await asyncio.sleep(1.0)  # its window closed: the slow request is at the model
    answered = dep.sim.stats["completions"]
    await dep.produce_items(_items(20, "fast"))  # offsets 12..31, answered at once
    seen: set[int] = set()
    while time.monotonic() - sent < slow_s - 5:
        seen.add((await committed_offsets(dep.bootstrap, dep.settings)).get(0, 0))
        await asyncio.sleep(0.2)
    assert dep.sim.stats["completions"] > answered, "the later batch was not answered meanwhile"
    assert seen == {10}, f"the commit moved past the slow batch at offset 10: {seen}"
    dep.proc.kill()  # while the slow batch is still at the model
    assert time.monotonic() - sent < slow_s
    assert (await committed_offsets(dep.bootstrap, dep.settings)).get(0) == 10
    first = await _calls(dep)
    assert not any(r["instance"].startswith(("slow-", "fast-")) for r in first)
    dep.proc.start()
    report = await dep.settle_quiet(32, wait_s=90)
    _assert_conserved(report)
    # The committed prefix was not redone; the slow batch was, by the new process.
    assert report.duplicate_calls == 0 and report.outcomes_per_input_max == 1
    calls = [r for r in await _calls(dep) if r["tool"] == "moderateComment"]
    workers = {r["instance"].split("-")[0]: r["batch"]["id"].split("-")[0] for r in calls}
    assert workers["slow"] != workers["pre"] and workers["fast"] != workers["pre"]
    assert {r["instance"] for r in calls} >= {"slow-0000", "slow-0001"}


# ----------------------------------------------------------------------------- 3


async def test_exception_in_the_guarded_batch_body_is_retried(deploy: Deploy) -> None:
    dep = await deploy(STREAM_CRASH_AT="raise:solved:1")
    await dep.produce_items(_items(30, "retry"))
    report = await dep.settle(30, wait_s=60)
    _assert_conserved(report)
    log = dep.proc.tail(2000)
    assert "fault injection: raising at solved (hit 1)" in log
    assert "failed (try 1 of 3)" in log  # the batch was asked again, not acked
    assert dep.proc.proc is not None and dep.proc.proc.poll() is None
    calls = [r for r in await _calls(dep) if r["tool"] == "moderateComment"]
    assert sorted(r["instance"] for r in calls) == [f"retry-{i:04d}" for i in range(30)]


async def test_exception_that_keeps_failing_dead_letters_with_the_error(deploy: Deploy) -> None:
    dep = await deploy(STREAM_CRASH_AT="raise:solved:1+")
    await dep.produce_items(_items(12, "broken"))
    report = await dep.settle(12, wait_s=60)
    assert report.unaccounted == 0 and report.unexpected == 0
    assert report.item_dead_letters == 12
    assert sum(report.calls_by_tool.values()) == 0  # nothing of a failed batch is published
    letters = await dep.records(dep.settings.topics.dead_letter)
    assert {d["code"] for d in letters} == {"internal_error"}
    assert all("injected fault at solved" in d["reason"] for d in letters)
    assert sorted(d["instance"] for d in letters) == [f"broken-{i:04d}" for i in range(12)]


async def test_exception_after_the_answer_is_retried_in_place(deploy: Deploy) -> None:
    """Past the solver (the batch's records built) an exception is retried too; nothing
    of the batch is staged until it is delivered, and the worker goes on."""
    dep = await deploy(STREAM_CRASH_AT="raise:after_llm:1")
    await dep.produce_items(_items(30, "inplace"))
    report = await dep.settle(30, wait_s=30)  # a retry takes about a second
    _assert_conserved(report)
    log = dep.proc.tail(2000)
    assert "fault injection: raising at after_llm (hit 1)" in log
    assert "solving failed (try 1 of 3)" in log
    assert dep.proc.proc is not None and dep.proc.proc.poll() is None


async def test_exception_after_the_answer_that_keeps_failing_dead_letters(deploy: Deploy) -> None:
    dep = await deploy(STREAM_CRASH_AT="raise:after_llm:1+")
    await dep.produce_items(_items(12, "late"))
    report = await dep.settle(12, wait_s=60)
    assert report.unaccounted == 0 and report.unexpected == 0
    assert report.item_dead_letters == 12
    letters = await dep.records(dep.settings.topics.dead_letter)
    assert {d["code"] for d in letters} == {"internal_error"}
    assert all("injected fault at after_llm" in d["reason"] for d in letters)


async def test_when_no_commit_can_go_through_the_worker_stops_and_the_redo_delivers(
    deploy: Deploy,
) -> None:
    """The last fallback, for real: every commit fails inside its transaction, so each
    unit is dropped, reopened after a back-off and fails again. The worker must stop (not
    commit, not loop for ever); restarted, the group redoes the batch, exactly once."""
    dep = await deploy(STREAM_CRASH_AT="raise:mid_commit:1+")
    await dep.produce_items(_items(12, "fatal"))
    proc = dep.proc.proc
    assert proc is not None
    for _ in range(240):
        if proc.poll() is not None:
            break
        await asyncio.sleep(0.25)
    else:
        pytest.fail(f"the worker went on after the last fallback failed:\n{dep.proc.tail()}")
    assert "times in a row" in dep.proc.tail(3000)
    assert proc.returncode not in (0, -signal.SIGKILL)
    assert not await _calls(dep)  # every transaction was aborted: nothing is visible
    dep.proc.env.pop("STREAM_CRASH_AT")
    dep.proc.start()  # the supervisor's restart: the group redelivers from the last commit
    report = await dep.settle_quiet(12, wait_s=90)
    assert report.unaccounted == 0 and report.unexpected == 0, report.summary()
    calls = [r for r in await _calls(dep) if r["tool"] == "moderateComment"]
    assert {r["instance"] for r in calls} == {f"fatal-{i:04d}" for i in range(12)}
    assert report.duplicate_calls == 0


# ----------------------------------------------------------------------------- 5


async def _published_at_least(dep: Deployment, n: int, wait_s: float) -> int:
    deadline = time.monotonic() + wait_s
    count = 0
    while time.monotonic() < deadline:
        count = len(await dep.records(dep.activity_topic("moderateComment")))
        if count >= n:
            break
        await asyncio.sleep(0.1)
    return count


async def _on_own_broker(broker: LocalKafka, sim: Simulator, url: str, **env: str) -> Deployment:
    """A processor on fresh topics of a broker this test starts and stops itself."""
    settings, spec, proc = await launch_processor(
        broker.bootstrap,
        url,
        f"b{secrets.token_hex(3)}.",
        "stream-chaos-",
        None,
        STREAM_WEB_HOST="127.0.0.1",
        STREAM_WEB_PORT=str(_free_port()),
        STREAM_SESSION_TIMEOUT_S="6",
        **env,
    )
    return Deployment(broker.bootstrap, settings, spec, sim, proc)


async def test_broker_restart_clean_and_kill_9_loses_nothing(
    simulator: tuple[Simulator, str], tmp_path: Path
) -> None:
    """The broker stopped cleanly, then killed -9 and kept down for more than three
    publish timeouts, each while batches are in flight and publishes pending: the
    processor waits it out (its transactions fail or wait, and their units redo the
    uncommitted work once it is back), nothing is dead-lettered, new items flow at once,
    and once nothing arrives any more a read_committed reader sees each outcome once."""
    sim, url = simulator
    # Slow answers: batches are still in flight, and publishes pending, when it goes down.
    sim.config = sim.config.model_copy(update={"faults": Faults(), "latency_ms": 1000.0})
    broker = LocalKafka(data_dir=tmp_path / "kafka")  # its data survives each restart
    await asyncio.to_thread(broker.start)
    proc: ProcessorProcess | None = None
    try:
        dep = await _on_own_broker(broker, sim, url, STREAM_PUBLISH_TIMEOUT_MS="3000")
        proc = dep.proc
        assert proc.proc is not None
        pid, total = proc.proc.pid, 0
        for how, down_s in (("sigterm", 0.0), ("kill-9", 10.0)):
            await dep.produce_items(_items(200, f"{how}-before"))
            total += 200
            published = await _published_at_least(dep, total - 200 + 25, 60)
            assert published < total, "everything was published before the broker went down"
            await asyncio.to_thread(broker.stop if how == "sigterm" else broker.kill)
            # The processor meets a missing broker mid-publish; after a kill -9, for more
            # than three publish timeouts (its restart takes some seconds more).
            await asyncio.sleep(down_s)
            await asyncio.to_thread(broker.start)
            assert proc.proc.poll() is None, f"processor died with the broker\n{proc.tail()}"
            await dep.produce_items(_items(50, f"{how}-after"))  # must flow: no stall
            total += 50
            report = await dep.settle_quiet(total, wait_s=180)
            print(f"after the {how} restart: {report.summary()}")
            _assert_conserved(report)  # no item dead-lettered for the outage
            assert report.duplicate_calls == 0 and report.outcomes_per_input_max == 1
            calls = [r for r in await _calls(dep) if r["tool"] == "moderateComment"]
            assert {f"{how}-after-{i:04d}" for i in range(50)} <= {r["instance"] for r in calls}
            _same_call_same_item(calls)
        assert await dep.records(dep.settings.topics.dead_letter) == []
        assert proc.proc.pid == pid and proc.proc.poll() is None  # reconnected, not restarted
        logged = proc.log_path.read_text(errors="replace")
        assert "Unable connect to node" in logged, "the processor never met the outage"
    finally:
        if proc is not None:
            proc.stop()
            print(f"--- processor log (tail) ---\n{proc.tail(30)}")
        await asyncio.to_thread(broker.stop)
