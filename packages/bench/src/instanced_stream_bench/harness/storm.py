"""`stream bench --churn --restarts N`: progress under a restart storm (issue 44). Safety
is counted after the stop; progress must be seen while the processors run, before any
stop's drain can finish what a stuck group left.

The run: the churn bench's deployment (harness/fleet.py: fresh topics, the tickets example,
its activity worker, the simulator) with `states` finished workflow states already on
the changelog and `processors` members started together. Once every partition is open,
tickets flow at a steady rate while a random member is SIGKILLed and restarted, `restarts`
times in all, in three manners by turns: aimed inside a commit (as the chaos demo aims: its
live API shows consumed records not yet committed), at a random moment, and a pair where
the restarted member is killed again while joining (its log shows its join request, no
assignment yet). With `brokers` 3 (testing/cluster.py), the broker that coordinates the
group is SIGKILLed `broker_kills` times during the storm and restarted after
`broker_down_s`. After the last kill the flow goes on for `quiet_s`, then the members get
until every input is decided and every workflow ended (at most `bound_s` past the last
send); then the stop, then the audit.

Every figure (harness/progress.py) is cut at the stop: `decided_late`, `max_unowned_s`
(polled from each live member's /readyz every 0.5 s, harness/owners.py), `max_join_s`,
`rebalances_per_min` (from the generations in the members' logs); `crashes` are lives
that ended on their own; `missing` and `duplicate_outcomes` come from the audit after the
stop, as the churn bench counts them.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from instanced_stream.errors import StreamError
from instanced_stream.kafka.topics import answer_journal, state_changelog
from instanced_stream.settings import Settings

from instanced_stream_bench.harness.changelog_states import write_states
from instanced_stream_bench.harness.churn import audit_run
from instanced_stream_bench.harness.coordinator import BrokerKiller
from instanced_stream_bench.harness.fleet import Group, deploy, prepare_run
from instanced_stream_bench.harness.kills import Kills
from instanced_stream_bench.harness.owners import Owners
from instanced_stream_bench.harness.paid_twice import answer_figures, distinct, journaled_twice
from instanced_stream_bench.harness.progress import (
    Member,
    decided_late,
    join_times,
    owned_over_time,
    rebalances_per_min,
    unowned,
)
from instanced_stream_bench.harness.rebalances import from_logs, group_facts, wait_assigned
from instanced_stream_bench.harness.target import SimProcess
from instanced_stream_bench.harness.timeline import Watch, produce_paced
from instanced_stream_bench.testing.cluster import LocalCluster
from instanced_stream_bench.testing.samples import tickets

__all__ = ["BAR", "StormPlan", "run_storm", "storm_command", "verdict"]

Say = Callable[[str], None]


@dataclass(slots=True)
class StormPlan:
    """The storm's shape; times in seconds. `budget_s` bounds the whole run, so a stuck
    engine still yields its report."""

    partitions: int = 24
    states: int = 100_000
    processors: int = 3
    restarts: int = 20
    rate: float = 6.0  # tickets a second
    lead_s: float = 20.0  # items flowing, every partition open, before the first kill
    # Between kills: past the group's session timeout (15 s), so each kill is one
    # disturbance. A SIGKILLed member is noticed only when its session expires, and an
    # eager group's rebalance waits for it meanwhile with every partition revoked: kills
    # closer than that keep the group rebalancing whatever the engine does.
    gap_s: tuple[float, float] = (20.0, 30.0)
    session_timeout_s: float | None = None  # the processors' (None: their default, 15 s)
    aim_s: float = 8.0  # a kill aimed inside a commit waits this long for one
    join_wait_s: float = 30.0  # a restarted member's join request, at most
    quiet_s: float = 30.0  # the flow goes on after the last kill
    bound_s: float = 60.0  # an item decided later than this is late
    ready_wait_s: float = 240.0  # every partition open at the start, at most
    budget_s: float = 2400.0
    latency_ms: float = 300.0
    window_wait_ms: int | None = None  # the example's own
    brokers: int = 1
    # Static members (a StatefulSet's pod names, STREAM_GROUP_INSTANCE_ID): a restarted
    # member takes its partitions back without a rebalance; False: dynamic members.
    static: bool = True
    broker_kills: int = 2
    broker_down_s: float = 10.0
    seed: int = field(default_factory=lambda: random.SystemRandom().randrange(2**32))
    started: float = field(default_factory=time.monotonic)

    def left(self) -> float:
        return self.budget_s - (time.monotonic() - self.started)


class _Flow:
    """Tickets at `rate` until `stop()`, in chunks of 5 s (each a paced producer of its
    own: a chunk ends whole, so every send is kept), with each record's position and
    send time."""

    def __init__(self, bootstrap: str, topic: str, rate: float, origin: float) -> None:
        self.bootstrap, self.topic, self.rate, self.origin = bootstrap, topic, rate, origin
        self.sent: dict[tuple[int, int], float] = {}
        self.instances: dict[tuple[int, int], str] = {}
        self._stopping = False

    def stop(self) -> None:
        self._stopping = True

    async def run(self) -> None:
        k = 0
        while not self._stopping:
            n = max(1, int(self.rate * 5))
            items = distinct(
                [{**t, "_instance": f"s{k}-{t['_instance']}"} for t in tickets(n, seed=k)]
            )
            sent = await produce_paced(
                self.bootstrap, self.topic, items, self.rate, self.origin, float("inf")
            )
            self.sent.update(sent)
            # Sent one after another, in order: the k-th position is the k-th item's.
            self.instances.update(zip(sent, (i["_instance"] for i in items), strict=False))
            k += 1


async def _all_open(owners: Owners, partitions: int, until: float) -> bool:
    while time.monotonic() < until:
        if len(owners.latest()) >= partitions:
            return True
        await asyncio.sleep(0.5)
    return False


async def _settle(watch: Watch, inputs: int, until: float, storm: Kills) -> bool:
    """Until every input has an outcome and every workflow ended, or `until`; a member
    that exits on its own meanwhile is a crash, started again."""
    while time.monotonic() < until:
        storm.check()
        if len(watch.first) >= inputs and len(watch.ended) >= inputs:
            return True
        await asyncio.sleep(0.5)
    storm.check()
    return False


async def _run(
    bootstrap: str,
    sim: SimProcess,
    workdir: Path,
    plan: StormPlan,
    say: Say,
    brokers: BrokerKiller | None,
) -> dict[str, Any]:
    rf = plan.brokers if plan.brokers > 1 else None
    isr = plan.brokers - 1 if plan.brokers > 1 else None
    d = await deploy(bootstrap, sim, workdir, plan.partitions, plan.window_wait_ms, rf, isr)
    if plan.session_timeout_s is not None:
        d.env["STREAM_SESSION_TIMEOUT_S"] = str(plan.session_timeout_s)
    t = d.settings.topics
    gid = f"{d.settings.topic_prefix}{d.settings.app_id}"
    wrote = await write_states(bootstrap, state_changelog(d.settings), plan.partitions, plan.states)
    say(f"storm: {plan.states} states written in {wrote['seconds']} s")
    worker = d.start_worker()
    origin = time.monotonic()
    wall_origin = time.time()
    group = Group(d.env, d.run_dir, origin, static="processor" if plan.static else None)
    storm = Kills(group, gid, plan, origin, say)
    for slot in range(plan.processors):
        group.start(slot)
    if brokers is not None:
        brokers.begin(gid, origin, say)
    result: dict[str, Any] = {"states_written": wrote, "group": gid}
    try:
        async with (
            Watch(bootstrap, d.outcome_topics, t.input, t.done) as watch,
            Owners(group, origin) as owners,
        ):
            ready = time.monotonic() + min(plan.ready_wait_s, plan.left() / 3)
            result["first_assignment_done"] = await wait_assigned(group, ready)
            result["all_open_at_start"] = await _all_open(owners, plan.partitions, ready)
            flow_start = storm.now()
            asked_before = await sim.stats()
            result["flow_start_s"] = round(flow_start, 1)
            say(f"storm: every partition open at {flow_start:.0f} s; tickets flow")
            flow = _Flow(bootstrap, t.input, plan.rate, origin)
            producing = asyncio.create_task(flow.run())
            await storm.wait(plan.lead_s)
            # Room kept for the quiet time, the settling, the stop and the audit.
            storm_until = time.monotonic() + max(30.0, plan.left() - plan.quiet_s - 240)
            await storm.run(brokers, storm_until)
            await storm.wait(plan.quiet_s)
            flow.stop()
            await producing
            sent = flow.sent
            last_sent = max(sent.values(), default=storm.now())
            settle_until = origin + last_sent + plan.bound_s + 5
            settle_until = min(settle_until, time.monotonic() + max(10.0, plan.left() - 150))
            settled = await _settle(watch, len(sent), settle_until, storm)
            stop_at = storm.now()
            first = {k: v - origin for k, v in watch.first.items()}
            result["workflows_unended_at_stop"] = len(sent) - len(watch.ended)
            # Which, with where and when their ticket went and its first outcome.
            result["unended_examples"] = [
                [flow.instances.get(pos), *pos, round(at, 2), first.get(pos)]
                for pos, at in sorted(sent.items(), key=lambda kv: kv[1])
                if flow.instances.get(pos) not in watch.ended
            ][:20]
            samples = list(owners.samples)
            asked_after = await sim.stats()
            result["owner_polls_unanswered"] = owners.failed
    finally:
        say("storm: stopping the processors")
        await group.stop(list(group.running))
        worker.stop()
    result.update(settled_before_stop=settled, stop_s=round(stop_at, 2), items=len(sent))
    result.update(decided_late(sent, first, stop_at, plan.bound_s))
    ended = {life.name: life.stopped_s for life in group.lives}
    owned = owned_over_time(samples, ended)
    result.update(unowned(owned, plan.partitions, flow_start, stop_at))
    members: list[Member] = []
    generations: dict[int, float] = {}
    for life in group.lives:
        assigned, gens = group_facts(life.proc.log_path, gid)
        members.append(
            Member(
                life.name,
                life.started_s,
                None if assigned is None else assigned - wall_origin,
                life.stopped_s,
            )
        )
        for g, at in gens.items():
            generations[g] = min(generations.get(g, at), at)
    result.update(join_times(members, stop_at))
    result.update(
        rebalances_per_min({g: at - wall_origin for g, at in generations.items()}, stop_at)
    )
    result.update(
        answer_figures([life.proc.log_path for life in group.lives], asked_before, asked_after)
    )
    result["kills"] = storm.kills
    result["crashes"] = storm.crashes
    if brokers is not None:
        result["broker_kills"] = brokers.report(owned, plan.partitions, stop_at)
    result["processors"] = from_logs(group.lives, wall_origin)["processors"]
    result["audit"] = await audit_run(bootstrap, d, len(sent))
    result["answers_paid_twice"] = await journaled_twice(bootstrap, answer_journal(d.settings))
    result["raw"] = {
        "sent": [[p, o, round(at, 3)] for (p, o), at in sorted(sent.items())],
        "first_outcome": [[p, o, round(at, 3)] for (p, o), at in sorted(first.items())],
        "owner_polls": [[round(at, 2), answers] for at, answers in samples],
        "lives": [
            {
                "name": m.name,
                "started_s": round(m.started, 2),
                "first_assigned_s": m.first_assigned,
                "ended_s": m.ended,
            }
            for m in members
        ],
        "generations": {
            str(g): round(at - wall_origin, 2) for g, at in sorted(generations.items())
        },
    }
    return result


async def run_storm(
    bootstrap: str,
    plan: StormPlan,
    say: Say = print,
    brokers: BrokerKiller | None = None,
    keep_logs: Path | None = None,
) -> dict[str, Any]:
    """The storm; the report churn.json holds (its figures first, `raw` last)."""
    async with prepare_run(plan.latency_ms, keep_logs) as (workdir, sim):
        run = await _run(bootstrap, sim, workdir, plan, say, brokers)
    audit_ = run.pop("audit")
    phases: dict[str, int] = {}
    for kill in run["kills"]:
        phases[kill["phase"]] = phases.get(kill["phase"], 0) + 1
    figures = {
        "partitions": plan.partitions,
        "states": plan.states,
        "processors": plan.processors,
        "brokers": plan.brokers,
        "membership": "static" if plan.static else "dynamic",
        "restarts": len(run["kills"]),
        "kills_by_phase": phases,
        "decided_late": run.pop("decided_late"),
        "max_unowned_s": run.pop("max_unowned_s"),
        "max_join_s": run.pop("max_join_s"),
        "rebalances_per_min": run.pop("rebalances_per_min"),
        "crashes": len(run["crashes"]),
        "missing": audit_["missing"],
        "duplicate_outcomes": audit_["duplicate_outcomes"],
        # The answer journal: redos that took an answer instead of asking, and answers
        # the model was asked for again all the same (issue 55).
        "asks_saved": run.pop("asks_saved"),
        "answers_paid_twice": run.pop("answers_paid_twice"),
        "items_asked_again": run.pop("items_asked_again"),
    }
    return {
        **figures,
        "audit": audit_,
        "storm": run,
        "plan": {
            "rate": plan.rate,
            "lead_s": plan.lead_s,
            "gap_s": list(plan.gap_s),
            "session_timeout_s": plan.session_timeout_s,
            "quiet_s": plan.quiet_s,
            "bound_s": plan.bound_s,
            "latency_ms": plan.latency_ms,
            "window_wait_ms": plan.window_wait_ms,
            "broker_kills": plan.broker_kills if brokers is not None else 0,
            "broker_down_s": plan.broker_down_s,
            "seed": plan.seed,
            "budget_s": plan.budget_s,
        },
        "elapsed_s": round(time.monotonic() - plan.started, 1),
    }


@contextlib.contextmanager
def _brokers(plan: StormPlan, configured: str | None) -> Iterator[tuple[str, BrokerKiller | None]]:
    """One broker (the configured one, or started here), or a local cluster of
    `plan.brokers` whose coordinator the storm may kill."""
    from instanced_stream_bench.testing.broker import kafka_bootstrap

    if plan.brokers <= 1:
        with kafka_bootstrap(configured) as bootstrap:
            yield bootstrap, None
        return
    if configured:
        raise StreamError(
            "--brokers starts its own local cluster (its brokers are killed during the run): "
            "unset STREAM_BOOTSTRAP_SERVERS"
        )
    with LocalCluster(plan.brokers) as cluster:
        yield cluster.bootstrap, BrokerKiller(cluster, plan.broker_down_s)


# Issue 44's bar: each figure's upper limit.
BAR: dict[str, float] = {
    "decided_late": 0,
    "max_unowned_s": 30.0,
    "max_join_s": 30.0,
    "crashes": 0,
    "missing": 0,
    "duplicate_outcomes": 0,
    # Issue 55's: a member that lost a partition may still journal a batch in flight
    # after the new owner read the journal, so this can miss by a few.
    "answers_paid_twice": 0,
}


def verdict(report: dict[str, Any]) -> dict[str, tuple[Any, float, bool]]:
    """Each figure of the bar: its value, its limit, whether it is met (a figure the run
    could not compute, None, is not)."""
    return {
        k: (report[k], limit, report[k] is not None and report[k] <= limit)
        for k, limit in BAR.items()
    }


def storm_command(args: Any, settings: Settings) -> int:
    """`stream bench --churn --restarts N [--brokers 3]`: the storm, DIR/churn.json."""
    plan = StormPlan(
        partitions=args.partitions or 24,
        states=args.states,
        restarts=args.restarts,
        brokers=args.brokers,
        static=args.membership == "static",
    )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    def say(msg: str) -> None:
        print(f"[{time.monotonic() - plan.started:5.0f} s] {msg}", file=sys.stderr, flush=True)

    with _brokers(plan, settings.bootstrap_servers) as (bootstrap, brokers):
        report = asyncio.run(run_storm(bootstrap, plan, say, brokers, keep_logs=out / "logs"))
    report["bar"] = verdict(report)
    (out / "churn.json").write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))
    shape = ("membership", "brokers", "restarts", "rebalances_per_min", "elapsed_s")
    print(" ".join(f"{k}={report[k]}" for k in shape))
    for figure, (value, limit, met) in report["bar"].items():
        print(f"{figure:20} {value!s:>8}  limit {limit:>4}  {'met' if met else 'MISSED'}")
    return 0
