"""`stream bench --churn`: what a rebalance costs at size (issue 37).

One broker, the LLM simulator and the tickets example's activity worker as their own
processes. First a steady run: one processor, tickets paced at a fixed rate, its LLM
requests per item counted by the simulator. In both runs a window closes on its item
count (20; it waits up to 6 s), as under the backlog that makes ops scale out: at this
rate a 200 ms wait would close windows on time, and requests per item would measure how
many processors share the flow (three carry fewer items a request: 1.15 requests a
ticket against one processor's 0.58, measured), not what the moves cost. Then the churn
run on fresh topics whose state changelog already holds `states` finished workflow
states (about 3 KB each, written in the store's own record format before any processor
starts): the same tickets flow at the same rate while the group is scaled
1 -> 3 -> 1 -> 3 -> 1.

Measured, and written to DIR/churn.json:
- expulsions: a member the group put out rejoins under a new member id (aiokafka resets
  it on UnknownMemberId), so each incarnation's distinct member ids beyond the first;
- resume: per move and partition, the longest time the partition had an input waiting
  and decided nothing (from the produced records and when their first outcome became
  visible read_committed); `max_resume_s` is None when a partition never resumed;
- restore: from the processors' logs, per assignment the time from aiokafka's "Setting
  newly assigned partitions" to each partition's "states restored" line and to the end
  of the callback;
- requests per item against the steady run, items/s during and outside the moves, the
  peak RSS of every processor incarnation;
- missing inputs (ops.audit) and duplicate outcomes counted per input: one turn of
  one workflow decided by two batches is two outcomes, however many copies each has.

`init_transactions` measures what the one-producer-per-partition ceiling costs a move:
P transactional producers started together (as an assignment opens its units), then
again, each fencing its predecessor (as the partition's next owner does).
"""

from __future__ import annotations

import asyncio
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from instanced_stream.kafka.topics import answer_journal, read_topic, state_changelog
from instanced_stream.ops.audit import audit
from instanced_stream.settings import Settings

from instanced_stream_bench.harness.changelog_states import same_format, write_states
from instanced_stream_bench.harness.fleet import Deploy, Group, deploy, prepare_run
from instanced_stream_bench.harness.moves import init_transactions, processor_moves
from instanced_stream_bench.harness.outcomes import per_input_outcomes
from instanced_stream_bench.harness.paid_twice import answer_figures, distinct, journaled_twice
from instanced_stream_bench.harness.rebalances import from_logs, rebalance_times, wait_assigned
from instanced_stream_bench.harness.target import SimProcess
from instanced_stream_bench.harness.timeline import Roll, Watch, produce_paced, resume
from instanced_stream_bench.testing.samples import tickets

__all__ = ["ChurnPlan", "audit_run", "churn_command", "run_churn"]


@dataclass(slots=True)
class ChurnPlan:
    """The run's shape. Times in seconds; `budget_s` bounds the whole run, so a stuck
    engine still yields a report."""

    partitions: int = 24
    states: int = 100_000
    rate: float = 6.0  # tickets per second, in both runs
    lead_s: float = 20.0  # one member, items flowing, before the first move
    hold_s: float = 50.0  # between moves
    steady_s: float = 45.0  # items of the steady run: rate * steady_s
    ready_wait_s: float = 120.0  # the first member's first assignment, at most
    budget_s: float = 600.0
    moves: int = 4  # 1 -> 3 -> 1 -> 3 -> 1
    settle_s: float = 120.0  # after the flow, for the last outcomes, at most
    processors: int = 3
    latency_ms: float = 300.0
    # Long enough for 20 items at a third of the rate (about 8 asks a second), with room.
    window_wait_ms: int = 6000
    started: float = field(default_factory=time.monotonic)

    def left(self) -> float:
        return self.budget_s - (time.monotonic() - self.started)


def _items(n: int, tag: str) -> list[dict[str, str]]:
    return distinct([{**t, "_instance": f"{tag}{t['_instance']}"} for t in tickets(n)])


async def settle(watch: Watch, inputs: int, until: float, group: Group | None = None) -> bool:
    """Until every input has an outcome and every workflow ended, or `until`."""
    while time.monotonic() < until:
        if group is not None:
            group.sample()
            group.exited()
        if len(watch.first) >= inputs and len(watch.ended) >= inputs:
            return True
        await asyncio.sleep(0.5)
    return False


async def _steady(
    bootstrap: str, sim: SimProcess, workdir: Path, plan: ChurnPlan, say: Any
) -> dict[str, Any]:
    """One processor, no states, the tickets at the churn run's rate: the baseline."""
    d = await deploy(bootstrap, sim, workdir, plan.partitions, plan.window_wait_ms)
    items = _items(max(10, int(plan.rate * plan.steady_s)), "s-")
    worker = d.start_worker()
    origin = time.monotonic()
    group = Group(d.env, d.run_dir, origin)
    group.start(0)
    t = d.settings.topics
    try:
        async with Watch(bootstrap, d.outcome_topics, t.input, t.done) as watch:
            await wait_assigned(group, origin + 90)
            before = await sim.stats()
            until = time.monotonic() + plan.steady_s + 30
            sent = await produce_paced(bootstrap, t.input, items, plan.rate, origin, until)
            settled = await settle(
                watch, len(sent), time.monotonic() + min(60, plan.settle_s), group
            )
            after = await sim.stats()
    finally:
        await group.stop([0])
        worker.stop()
    asked = after.get("completions", 0) - before.get("completions", 0)
    instances = after.get("instances", 0) - before.get("instances", 0)
    say(f"steady: {len(sent)} tickets, {asked:.0f} requests, settled {settled}")
    return {
        "items": len(sent),
        "requests": int(asked),
        "item_asks": int(instances),
        "asks_per_request": round(instances / max(asked, 1), 2),  # how full the windows were
        "requests_per_item": round(asked / max(len(sent), 1), 4),
        "settled": settled,
    }


async def _churn(
    bootstrap: str, sim: SimProcess, workdir: Path, plan: ChurnPlan, say: Any
) -> dict[str, Any]:
    d = await deploy(bootstrap, sim, workdir, plan.partitions, plan.window_wait_ms)
    t = d.settings.topics
    changelog = state_changelog(d.settings)
    wrote = await write_states(bootstrap, changelog, plan.partitions, plan.states)
    sample = [rec.value async for rec in _first_records(bootstrap, changelog)]
    wrote["store_format"] = bool(sample) and all(same_format(v) for v in sample if v)
    say(f"churn: {plan.states} states written in {wrote['seconds']} s ({wrote['mean_bytes']} B)")
    worker = d.start_worker()
    origin = time.monotonic()
    wall_origin = time.time()
    group = Group(d.env, d.run_dir, origin)
    moves: list[dict[str, Any]] = []
    crashes: list[str] = []
    group.start(0)
    result: dict[str, Any] = {"states_written": wrote}
    try:
        roll = Roll(bootstrap, f"{d.settings.topic_prefix}{d.settings.app_id}", origin)
        async with (
            Watch(bootstrap, d.outcome_topics, t.input, t.done) as watch,
            roll,
        ):
            assigned = await wait_assigned(
                group, time.monotonic() + min(plan.ready_wait_s, plan.left() / 3)
            )
            result["first_assignment_s"] = round(time.monotonic() - origin, 1)
            result["first_assignment_done"] = assigned
            before = await sim.stats()
            schedule = [plan.lead_s + k * plan.hold_s for k in range(plan.moves)]
            flow_s = plan.lead_s + plan.moves * plan.hold_s
            # What is left after the flow: settling and stopping, within the budget.
            flow_s = min(flow_s, max(10.0, plan.left() - min(90.0, plan.settle_s + 45)))
            flow_start = time.monotonic()
            items = _items(int(plan.rate * flow_s) + 1, "c-")
            producing = asyncio.create_task(
                produce_paced(bootstrap, t.input, items, plan.rate, origin, flow_start + flow_s)
            )
            others = list(range(1, plan.processors))
            for k, at in enumerate(schedule):
                while time.monotonic() < flow_start + at and not producing.done():
                    group.sample()
                    crashes += [life.name for life in group.exited()]
                    await asyncio.sleep(0.5)
                if producing.done():
                    break
                up = k % 2 == 0
                moved_at = time.monotonic() - origin
                if up:
                    for s in others:
                        group.start(s)
                else:
                    await group.stop(others)
                moves.append(
                    {
                        "move": f"1 -> {plan.processors}" if up else f"{plan.processors} -> 1",
                        "at_s": round(moved_at, 1),
                        "stop_took_s": None
                        if up
                        else round(time.monotonic() - origin - moved_at, 1),
                    }
                )
                say(f"churn: move {k + 1} ({moves[-1]['move']}) at {moved_at:.0f} s")
            sent = await producing
            flow_end = time.monotonic() - origin
            # Kept for the end: stopping (a SIGTERM's grace), the audit, init_transactions.
            settle_until = time.monotonic() + max(5.0, min(plan.settle_s, plan.left() - 75))
            settled = await settle(watch, len(sent), settle_until, group)
            crashes += [life.name for life in group.exited()]
            end = time.monotonic() - origin
            after = await sim.stats()
            first = {k: v - origin for k, v in watch.first.items()}
            unended = len(sent) - len(watch.ended)
    finally:
        await group.stop(list(group.running))
        worker.stop()
    asked = after.get("completions", 0) - before.get("completions", 0)
    instances = after.get("instances", 0) - before.get("instances", 0)
    result.update(answer_figures([life.proc.log_path for life in group.lives], before, after))
    result.update(
        items=len(sent),
        flow_s=round(flow_end, 1),
        settled=settled,
        settle_s=round(end - flow_end, 1),
        requests=int(asked),
        item_asks=int(instances),
        asks_per_request=round(instances / max(asked, 1), 2),
        requests_per_item=round(asked / max(len(sent), 1), 4),
        workflows_unended=unended,
        crashed=crashes,
    )
    result.update(resume(sent, first, moves, end, plan.partitions))
    # The raw timeline (seconds since the churn run's start), to recompute any figure.
    result["timeline"] = {
        "sent": [[p, o, round(at, 3)] for (p, o), at in sorted(sent.items())],
        "first_outcome": [[p, o, round(at, 3)] for (p, o), at in sorted(first.items())],
    }
    result["moves"] = moves
    result.update(from_logs(group.lives, wall_origin))
    # The broker's view and the processors' own (a new member id after an expulsion):
    # the larger count stands, both are shown.
    expelled = roll.expelled(group.lives)
    result["expelled"] = expelled
    result["group_polls"] = {"answered": len(roll.polls), "failed": roll.failed}
    result["expulsions_in_logs"] = result["expulsions"]
    result["expulsions"] = max(result["expulsions"], len(expelled))
    rebalance_times(moves, group.lives, wall_origin)
    result["audit"] = await audit_run(bootstrap, d, len(sent))
    result["answers_paid_twice"] = await journaled_twice(bootstrap, answer_journal(d.settings))
    return result


async def _first_records(bootstrap: str, topic: str, n: int = 5) -> Any:
    """A few records of the changelog as a consumer reads them."""
    count = 0
    async for rec in read_topic(bootstrap, topic):
        yield rec
        count += 1
        if count >= n:
            return


async def audit_run(bootstrap: str, d: Deploy, inputs: int) -> dict[str, Any]:
    """A run's audit: its inputs, those missing, call ids twice, outcomes per input."""
    report = await audit(bootstrap, d.settings.topics, d.tools)
    per_input = await per_input_outcomes(bootstrap, d.settings, d.tools)
    return {
        "inputs": report.inputs,
        "missing": report.unaccounted,
        "duplicate_call_ids": report.duplicate_calls,
        **per_input,
        "expected_inputs": inputs,
    }


async def run_churn(
    bootstrap: str, plan: ChurnPlan, say: Any = print, keep_logs: Path | None = None
) -> dict[str, Any]:
    """The steady run, then the churn run; the report churn.json holds. `keep_logs`:
    a folder the processors' logs are copied to before the work folder goes."""
    async with prepare_run(plan.latency_ms, keep_logs) as (workdir, sim):
        steady = await _steady(bootstrap, sim, workdir, plan, say)
        churn = await _churn(bootstrap, sim, workdir, plan, say)
        inits = await init_transactions(bootstrap, plan.partitions)
    # Against the steady run; honest only once every workflow of both runs ended (a
    # stranded one asks nothing more): `settled` says whether they did.
    ratio = asks = None
    audit_ = churn.pop("audit")
    # Items never decided ask nothing: a ratio over them would flatter a stuck run.
    if audit_["missing"]:
        pass
    elif steady["requests_per_item"]:
        ratio = round(churn["requests_per_item"] / steady["requests_per_item"], 3)
    if steady["item_asks"] and not audit_["missing"]:
        asks = round(
            churn["item_asks"] / churn["items"] / (steady["item_asks"] / steady["items"]), 3
        )
    return {
        "partitions": plan.partitions,
        "states": plan.states,
        "processors": plan.processors,
        "expulsions": churn.pop("expulsions"),
        "max_resume_s": churn.pop("max_resume_s"),
        "restore_s": churn.pop("restore_s"),
        "requests_per_item_ratio": ratio,
        # Items asked (an item in a request of 20 counts once): a re-ask after a move
        # shows here even when the stall packed fuller requests.
        "item_asks_per_item_ratio": asks,
        "settled": churn["settled"] and steady["settled"],
        "items_per_s_during_moves": churn.pop("items_per_s_during_moves"),
        "items_per_s_outside_moves": churn.pop("items_per_s_outside_moves"),
        "rss_mb": churn.pop("rss_mb"),
        "missing": audit_["missing"],
        "duplicate_outcomes": audit_["duplicate_outcomes"],
        # The answer journal (issue 55): a move's redo takes its answers, asks nothing.
        "asks_saved": churn.pop("asks_saved"),
        "answers_paid_twice": churn.pop("answers_paid_twice"),
        "items_asked_again": churn.pop("items_asked_again"),
        "audit": audit_,
        "steady": steady,
        "churn": churn,
        "init_transactions": inits,
        "plan": {
            "rate": plan.rate,
            "lead_s": plan.lead_s,
            "hold_s": plan.hold_s,
            "steady_s": plan.steady_s,
            "budget_s": plan.budget_s,
            "latency_ms": plan.latency_ms,
            "window_wait_ms": plan.window_wait_ms,
        },
        "elapsed_s": round(time.monotonic() - plan.started, 1),
    }


def churn_command(args: Any, settings: Settings) -> int:
    """`stream bench --churn`: the broker (or the configured one), the runs, churn.json."""
    from instanced_stream_bench.testing.broker import kafka_bootstrap

    plan = ChurnPlan(partitions=args.partitions or 24, states=args.states)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    def say(msg: str) -> None:
        print(f"[{time.monotonic() - plan.started:5.0f} s] {msg}", file=sys.stderr, flush=True)

    with kafka_bootstrap(settings.bootstrap_servers) as bootstrap:
        if args.init_transactions:
            found = asyncio.run(init_transactions(bootstrap, plan.partitions, rounds=3))
            found["processor"] = asyncio.run(processor_moves(bootstrap, plan.partitions))
            (out / "init_transactions.json").write_bytes(
                orjson.dumps(found, option=orjson.OPT_INDENT_2)
            )
            print(orjson.dumps(found, option=orjson.OPT_INDENT_2).decode())
            return 0
        report = asyncio.run(run_churn(bootstrap, plan, say, keep_logs=out / "logs"))
    timeline = report["churn"].pop("timeline")
    (out / "churn-timeline.json").write_bytes(orjson.dumps(timeline))
    text = orjson.dumps(report, option=orjson.OPT_INDENT_2)
    (out / "churn.json").write_bytes(text)
    keys = ("partitions", "states", "expulsions", "max_resume_s", "requests_per_item_ratio")
    keys += ("missing", "duplicate_outcomes", "asks_saved", "answers_paid_twice", "elapsed_s")  # type: ignore[assignment]
    print(" ".join(f"{k}={report[k]}" for k in keys))
    return 0
