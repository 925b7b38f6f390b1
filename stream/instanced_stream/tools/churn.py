"""`stream bench --churn`: what a rebalance costs at size (issue 37, DESIGN.md section 9).

One broker, the LLM simulator and the tickets example's activity worker as their own
processes. First a steady run: one processor, tickets paced at a fixed rate, its LLM
requests per item counted by the simulator. Then the churn run on fresh topics whose
state changelog already holds `states` finished workflow states (about 3 KB each,
written in the store's own record format before any processor starts): the same
tickets flow at the same rate while the group is scaled 1 -> 3 -> 1 -> 3 -> 1.

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
- missing inputs (tools.audit) and duplicate outcomes counted per input: one turn of
  one workflow decided by two batches is two outcomes, however many copies each has.

`init_transactions` measures what the one-producer-per-partition ceiling costs a move:
P transactional producers started together (as an assignment opens its units), then
again, each fencing its predecessor (as the partition's next owner does).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.partitioner import DefaultPartitioner

from instanced_stream.core.spec import load_spec
from instanced_stream.core.state import InstanceState
from instanced_stream.kafka import clients
from instanced_stream.kafka.topics import (
    activity_topics,
    ensure_product_topics,
    ensure_topics,
    read_topic,
    state_changelog,
)
from instanced_stream.settings import EXAMPLES, Settings
from instanced_stream.testing.broker import free_port
from instanced_stream.testing.samples import tickets
from instanced_stream.testing.sim.server import MODEL_NAME
from instanced_stream.tools.audit import audit
from instanced_stream.tools.demo import ProcessorProcess
from instanced_stream.tools.load import rss_mb
from instanced_stream.tools.report import Endpoint
from instanced_stream.tools.target import SimProcess

__all__ = [
    "ChurnPlan",
    "LogFacts",
    "churn_command",
    "done_state",
    "init_transactions",
    "parse_log",
    "per_input_outcomes",
    "processor_moves",
    "resume",
    "run_churn",
    "stalls",
    "write_states",
]

SPEC = EXAMPLES / "tickets" / "agent.yaml"
ACTIVITIES = EXAMPLES / "tickets" / "activities.py"
_STOP_GRACE_S = 40.0  # SIGTERM, then SIGKILL: the processor drains up to drain_s (25 s)


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
    started: float = field(default_factory=time.monotonic)

    def left(self) -> float:
        return self.budget_s - (time.monotonic() - self.started)


# ---------------------------------------------------------------------- the states


def done_state(instance: str, partition: int, ended_at: float, rng: random.Random) -> bytes:
    """A finished tickets workflow as the store writes it (`UnitStore.put`:
    `InstanceState.model_dump_json()`), about 3 KB: its ticket, the state its three
    turns wrote, their trace and the triggers they applied."""
    batch = [secrets.token_hex(8) for _ in range(3)]
    calls = [f"calls/{instance}/{t}/{k}" for t in range(3) for k in range(2)]
    customer = rng.choice(["acme", "globex", "initech", "umbrella", "hooli", "stark"])
    state = InstanceState(
        instance=instance,
        partition=partition,
        source={
            "topic": "items",
            "partition": partition,
            "offset": rng.randrange(10**6),
            "key": instance,
            "timestamp_ms": int(ended_at * 1000) - 9000,
        },
        input={
            "_instance": instance,
            "customer": customer,
            "subject": "Cannot log in since the last update " + "x" * rng.randint(0, 40),
            "body": (
                "Since this morning none of our agents can sign in; the page spins and "
                "then shows a timeout. We tried two browsers and cleared the cache. "
            )
            * 4,
        },
        state={
            "customer": {"name": customer, "plan": "enterprise", "vip": True},
            "urgent": {"why": "service impact"},
            "summary": "Agents cannot sign in after the update; enterprise customer, "
            "urgent, routed to the priority queue with the CRM details attached.",
        },
        turn=3,
        status="done",
        trace=[
            {
                "turn": t + 1,
                "batch_id": batch[t],
                "call_ids": calls[2 * t : 2 * t + 2],
                "note": "planned: look up the customer, assess urgency, route the ticket; "
                "the customer is on the enterprise plan",
            }
            for t in range(3)
        ],
        plan=[
            {
                "call_id": calls[2 * k],
                "tool": tool,
                "kind": "activity",
                "output": output,
                "status": "done",
                "call": {"_tool": tool, "_instance": instance, "reason": "planned"},
            }
            for k, (tool, output) in enumerate(
                [
                    ("lookupCustomer", "†state.customer"),
                    ("assessUrgency", "†state.urgent || †state.routine"),
                    ("routeTicket", None),
                ]
            )
        ],
        applied=[f"input:items/{partition}/{k}" for k in range(3)]
        + [f"result:{c}" for c in calls[:4]],
        ended={"status": "done", "reason": "routed to priority", "at": ended_at},
        owner=secrets.token_hex(3),
    )
    return state.model_dump_json().encode()


async def write_states(
    bootstrap: str, topic: str, partitions: int, count: int, prefix: str = "old-"
) -> dict[str, Any]:
    """`count` finished states on the changelog, each on the partition its instance id
    hashes to (the input's default partitioner), batched on a plain producer."""
    rng = random.Random(37)
    partitioner = DefaultPartitioner()
    every = list(range(partitions))
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        acks=1,
        linger_ms=20,
        max_batch_size=512 * 1024,
        max_request_size=8 * 1024 * 1024,
    )
    await producer.start()
    started = time.monotonic()
    written = 0
    try:
        pending: list[asyncio.Future[Any]] = []
        now = time.time()
        template: bytes | None = None
        for i in range(count):
            instance = f"{prefix}{i:07d}"
            p = partitioner(instance.encode(), every, every)
            if template is None or i % 500 == 0:
                # A fresh model every few hundred: the values vary, building 100k
                # pydantic models would cost more than the writing.
                template = done_state(instance, p, now - rng.uniform(0, 3600), rng)
                base = orjson.loads(template)
            value = dict(base, instance=instance, partition=p)
            value["input"] = dict(base["input"], _instance=instance)
            raw = orjson.dumps(value)
            written += len(raw)
            pending.append(await producer.send(topic, raw, key=instance.encode(), partition=p))
            if len(pending) >= 5000:
                await asyncio.gather(*pending)
                pending = []
        await asyncio.gather(*pending)
    finally:
        await producer.stop()
    seconds = time.monotonic() - started
    return {
        "states": count,
        "bytes": written,
        "mean_bytes": round(written / max(count, 1)),
        "seconds": round(seconds, 1),
    }


def _same_format(raw: bytes) -> bool:
    """What the store would write back for a record it read: byte-identical."""
    return InstanceState.model_validate_json(raw).model_dump_json().encode() == raw


# ---------------------------------------------------------------------- processes


class _Worker:
    """The example's activity worker, `stream activities`, as its own process."""

    def __init__(self, env: dict[str, str], log_path: Path) -> None:
        self.env = {**os.environ, **env}
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log_path.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "instanced_stream", "activities", str(ACTIVITIES)],
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)


@dataclass(slots=True)
class _Life:
    """One processor process from start to exit: its own log, its peak RSS."""

    name: str
    proc: ProcessorProcess
    started_s: float
    stopped_s: float | None = None
    peak_rss_mb: float = 0.0
    exit_code: int | None = None
    killed: bool = False  # needed SIGKILL after its grace


class _Group:
    """Processors of one group, started and stopped by slot; each start is a new life."""

    def __init__(self, env: dict[str, str], run_dir: Path, origin: float) -> None:
        self.env = env
        self.run_dir = run_dir
        self.origin = origin
        self.lives: list[_Life] = []
        self.running: dict[int, _Life] = {}

    def start(self, slot: int) -> _Life:
        n = sum(1 for life in self.lives if life.name.startswith(f"p{slot}."))
        env = {**self.env, "STREAM_WEB_PORT": str(free_port())}
        proc = ProcessorProcess(env, self.run_dir / f"processor{slot}.{n}.log")
        proc.start()
        life = _Life(f"p{slot}.{n}", proc, time.monotonic() - self.origin)
        self.lives.append(life)
        self.running[slot] = life
        return life

    async def stop(self, slots: Iterable[int]) -> None:
        lives = [self.running.pop(s) for s in slots if s in self.running]
        await asyncio.gather(*(asyncio.to_thread(self._stop, life) for life in lives))

    def _stop(self, life: _Life) -> None:
        proc = life.proc.proc
        if proc is None:
            return
        life.stopped_s = time.monotonic() - self.origin
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(_STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                life.killed = True
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        life.exit_code = proc.returncode

    def sample(self) -> None:
        for life in self.running.values():
            if life.proc.proc is not None:
                rss = rss_mb(life.proc.proc.pid)
                if rss is not None:
                    life.peak_rss_mb = max(life.peak_rss_mb, rss)

    def exited(self) -> list[_Life]:
        """Lives that ended on their own (a crash), noted and let go."""
        out = []
        for slot, life in list(self.running.items()):
            if life.proc.proc is not None and life.proc.proc.poll() is not None:
                life.exit_code = life.proc.proc.returncode
                life.stopped_s = time.monotonic() - self.origin
                del self.running[slot]
                out.append(life)
        return out


# ---------------------------------------------------------------------- what is seen


class _Watch:
    """Reads the outcome and done topics read_committed as they fill: when each input's
    first outcome became visible, and which workflows ended."""

    def __init__(self, bootstrap: str, topics: list[str], input_topic: str, done: str) -> None:
        self.bootstrap = bootstrap
        self.topics = [*topics, done]
        self.input = input_topic
        self.done_topic = done
        self.first: dict[tuple[int, int], float] = {}
        self.ended: set[str] = set()
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> _Watch:
        consumer = AIOKafkaConsumer(
            *self.topics,
            bootstrap_servers=self.bootstrap,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            fetch_max_wait_ms=100,
            isolation_level="read_committed",
        )
        await consumer.start()
        self._task = asyncio.create_task(self._run(consumer))
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self, consumer: AIOKafkaConsumer) -> None:
        try:
            while True:
                found = await consumer.getmany(timeout_ms=200, max_records=5000)
                now = time.monotonic()
                for tp, records in found.items():
                    for rec in records:
                        self._seen(tp.topic, rec.value, now)
        finally:
            await consumer.stop()

    def _seen(self, topic: str, value: bytes | None, now: float) -> None:
        try:
            rec = orjson.loads(value or b"{}")
        except orjson.JSONDecodeError:
            return
        if topic == self.done_topic:
            self.ended.add(str(rec.get("instance")))
            return
        src = rec.get("source") or {}
        if src.get("topic") != self.input:
            return
        self.first.setdefault((int(src["partition"]), int(src["offset"])), now)


class _Roll:
    """The group as the broker describes it, polled: which processes (by the pid in
    their client id) were members when. A member that leaves the group while its process
    runs and is not being stopped was expelled (a callback past the session timeout, a
    blocked event loop), whatever the process's own log managed to say."""

    def __init__(self, bootstrap: str, group: str, origin: float) -> None:
        self.bootstrap = bootstrap
        self.group = group
        self.origin = origin
        self.polls: list[tuple[float, set[int]]] = []  # (seconds since origin, pids)
        self.failed = 0
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> _Roll:
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        admin = clients.admin(self.bootstrap, request_timeout_ms=5000)
        await admin.start()
        try:
            while True:
                try:
                    found = await admin.describe_consumer_groups([self.group])
                    pids = set()
                    for response in found:
                        for described in response.to_object()["groups"]:
                            for member in described["members"]:
                                pid = _pid_of(str(member["client_id"]))
                                if pid is not None:
                                    pids.add(pid)
                    self.polls.append((time.monotonic() - self.origin, pids))
                except Exception:  # a busy broker: this poll is lost, the next may answer
                    self.failed += 1
                await asyncio.sleep(1.0)
        finally:
            await admin.close()

    def expelled(self, lives: list[_Life]) -> list[dict[str, Any]]:
        """Each time a process left the group while it ran and was not being stopped."""
        by_pid = {life.proc.proc.pid: life for life in lives if life.proc.proc is not None}
        out = []
        before: set[int] = set()
        for at, pids in self.polls:
            for pid in before - pids:
                life = by_pid.get(pid)
                if life is None:
                    continue
                stopping = life.stopped_s is not None and at >= life.stopped_s - 1.0
                if not stopping:
                    out.append({"processor": life.name, "left_at_s": round(at, 1)})
            before = pids
        return out


def _pid_of(client_id: str) -> int | None:
    """The processor's group client id is `<group>-<host>-<pid>-<worker>`."""
    parts = client_id.rsplit("-", 2)
    return int(parts[1]) if len(parts) == 3 and parts[1].isdigit() else None


async def _produce(
    bootstrap: str,
    topic: str,
    items: list[dict[str, str]],
    rate: float,
    origin: float,
    until: float,
) -> dict[tuple[int, int], float]:
    """Paced, keyed by instance; returns each record's position and when it was sent
    (seconds since `origin`). Stops early at `until` (monotonic)."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    await producer.start()
    sent: dict[tuple[int, int], float] = {}
    try:
        started = time.monotonic()
        for i, item in enumerate(items):
            ahead = started + i / rate - time.monotonic()
            if ahead > 0:
                await asyncio.sleep(ahead)
            if time.monotonic() > until:
                break
            at = time.monotonic()
            meta = await (
                await producer.send(topic, orjson.dumps(item), key=item["_instance"].encode())
            )
            sent[(meta.partition, meta.offset)] = at - origin
    finally:
        await producer.stop()
    return sent


def stalls(
    sent: dict[tuple[int, int], float],
    first: dict[tuple[int, int], float],
    end: float,
) -> dict[int, list[tuple[float, float]]]:
    """Per partition, every interval (start, stop) during which it had an input waiting
    and no input of it got its first outcome: from the later of the last outcome and the
    oldest waiting input's send, to the next outcome (or `end`, still waiting). Times in
    the same clock as `sent` and `first`."""
    out: dict[int, list[tuple[float, float]]] = {}
    by_partition: dict[int, list[int]] = defaultdict(list)
    for p, offset in sent:
        by_partition[p].append(offset)
    for p, offsets in by_partition.items():
        offsets.sort()
        events = sorted(
            (first[(p, o)], o) for o in offsets if (p, o) in first and first[(p, o)] <= end
        )
        waiting = set(offsets)
        last_outcome = float("-inf")
        gaps: list[tuple[float, float]] = []
        for at, offset in events:
            oldest = min((sent[(p, o)] for o in waiting if sent[(p, o)] <= at), default=None)
            if oldest is not None:
                gaps.append((max(last_outcome, oldest), at))
            waiting.discard(offset)
            last_outcome = at
        oldest = min((sent[(p, o)] for o in waiting if sent[(p, o)] <= end), default=None)
        if oldest is not None:
            gaps.append((max(last_outcome, oldest), end))
        out[p] = gaps
    return out


# ---------------------------------------------------------------------- the logs

_ASSIGNING = "Setting newly assigned partitions"
_RESTORED = re.compile(r"partition (\d+): (\d+) states restored")
_ASSIGNED = re.compile(r"rebalance: partitions \[([\d, ]*)\] assigned")
_JOINED = re.compile(r"with member_id (\S+)")
_UNKNOWN = "member_id was not recognized"


@dataclass(slots=True)
class LogFacts:
    """What one processor's JSON log says about its rebalances (times: epoch seconds)."""

    member_ids: list[str] = field(default_factory=list)
    revoking: list[float] = field(default_factory=list)  # each rebalance's start here
    unknown_member: int = 0
    # per assignment: when its callback began, each partition's restore, when it ended
    assignments: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def expulsions(self) -> int:
        return max(0, len(dict.fromkeys(self.member_ids)) - 1)


def _epoch(ts: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()


def parse_log(path: Path) -> LogFacts:
    facts = LogFacts()
    current: dict[str, Any] | None = None
    try:
        lines = path.read_bytes().splitlines()
    except OSError:
        return facts
    for line in lines:
        try:
            rec = orjson.loads(line)
        except orjson.JSONDecodeError:
            if b"Traceback" in line or b"Error" in line:
                facts.errors.append(line.decode(errors="replace")[:200])
            continue
        if not isinstance(rec, dict):
            continue
        msg = str(rec.get("message", ""))
        at = _epoch(rec["ts"]) if "ts" in rec else 0.0
        if rec.get("level") in ("ERROR", "CRITICAL"):
            facts.errors.append(msg[:200])
        if _UNKNOWN in msg:
            facts.unknown_member += 1
        if (joined := _JOINED.search(msg)) and "Joined group" in msg:
            facts.member_ids.append(joined[1])
        elif msg.startswith("Revoking previously assigned partitions"):
            facts.revoking.append(at)
        elif msg.startswith(_ASSIGNING):
            current = {"began": at, "restored": {}, "ended": None}
            facts.assignments.append(current)
        elif (restored := _RESTORED.search(msg)) and current is not None:
            current["restored"][int(restored[1])] = (at, int(restored[2]))
        elif _ASSIGNED.search(msg) and current is not None:
            current["ended"] = at
    return facts


# ---------------------------------------------------------------------- per input


async def per_input_outcomes(
    bootstrap: str, settings: Settings, tools: list[str]
) -> dict[str, int]:
    """Outcomes per input, read_committed: each turn of each workflow should be decided
    by one batch. A second batch's decision of the same turn (calls, or a no-action) is
    a duplicate outcome, however many copies of each are on the topics; copies of one
    outcome (a republished outbox) are counted apart, as `outcome_copies`."""
    t = settings.topics
    decisions: dict[tuple[str, object], set[str]] = defaultdict(set)
    copies: Counter[tuple[object, ...]] = Counter()
    for topic in [*tools, t.review]:
        async for rec in read_topic(bootstrap, topic):
            value = orjson.loads(rec.value or b"{}")
            batch = (value.get("batch") or {}).get("id", "?")
            decisions[(str(value.get("instance")), value.get("turn", 1))].add(batch)
            copies[("call", value.get("call_id"))] += 1
    async for rec in read_topic(bootstrap, t.no_action):
        value = orjson.loads(rec.value or b"{}")
        batch = (value.get("batch") or {}).get("id", "?")
        # A no-action ends the workflow's turn its batch decided: the done record's
        # trace names that batch, so it joins the calls' turn (see below).
        decisions[(str(value.get("instance")), ("no_action", batch))].add(batch)
        copies[("no_action", value.get("instance"), batch)] += 1
    done: Counter[str] = Counter()
    turn_of: dict[tuple[str, str], int] = {}
    async for rec in read_topic(bootstrap, t.done):
        value = orjson.loads(rec.value or b"{}")
        done[str(value.get("instance"))] += 1
        for entry in value.get("trace", []):
            turn_of[(str(value.get("instance")), str(entry.get("batch_id")))] = entry.get("turn")
    merged: dict[tuple[str, object], set[str]] = defaultdict(set)
    for (instance, turn), batches in decisions.items():
        if isinstance(turn, tuple):  # a no-action: to its turn when the trace knows it
            found = turn_of.get((instance, turn[1]))
            turn = found if found is not None else turn
        merged[(instance, turn)] |= batches
    return {
        "duplicate_outcomes": sum(len(b) - 1 for b in merged.values()),
        "inputs_decided_twice": len({i for (i, _), b in merged.items() if len(b) > 1}),
        "outcome_copies": sum(n - 1 for n in copies.values()),
        "duplicate_done": sum(n - 1 for n in done.values()),
        "workflows_ended": len(done),
    }


# ---------------------------------------------------------------------- init_transactions


async def init_transactions(bootstrap: str, partitions: int, rounds: int = 2) -> dict[str, Any]:
    """P transactional producers started side by side, as an assignment opens its units
    (`Membership._open`), `rounds` times on the same ids: every round after the first
    fences the previous one, as a partition's next owner does after a move."""
    prefix = f"churn-init-{secrets.token_hex(3)}"
    out: dict[str, Any] = {"partitions": partitions, "rounds": []}
    held: list[AIOKafkaProducer] = []
    for r in range(rounds):
        producers = [
            clients.producer(bootstrap, transactional_id=f"{prefix}.{p}") for p in range(partitions)
        ]

        async def timed(producer: AIOKafkaProducer) -> float:
            began = time.monotonic()
            await producer.start()  # init_transactions: fences the id's earlier holder
            return time.monotonic() - began

        began = time.monotonic()
        each = await asyncio.gather(*(timed(p) for p in producers))
        wall = time.monotonic() - began
        # One at a time too: what each costs alone, without the others queued with it.
        lone = []
        for p in range(min(partitions, 8)):
            solo = clients.producer(bootstrap, transactional_id=f"{prefix}.solo{r}.{p}")
            t0 = time.monotonic()
            await solo.start()
            lone.append(time.monotonic() - t0)
            await solo.stop()
        out["rounds"].append(
            {
                "fencing": r > 0,
                "wall_s": round(wall, 3),
                "per_producer_mean_s": round(sum(each) / len(each), 4),
                "per_producer_max_s": round(max(each), 4),
                "alone_mean_s": round(sum(lone) / len(lone), 4),
            }
        )
        for old in held:
            with contextlib.suppress(Exception):
                await old.stop()
        held = producers
    for old in held:
        with contextlib.suppress(Exception):
            await old.stop()
    return out


async def processor_moves(bootstrap: str, partitions: int, moves: int = 3) -> dict[str, Any]:
    """One `stream process` owning every partition, no states, restarted `moves` times:
    each start takes all of them over from the last (its producers fence the earlier
    ones). Its assignment callback is what a move costs the process, init_transactions
    for each partition's producer included."""
    with _workdir() as workdir:
        sim = SimProcess(workdir)
        sim.start()
        try:
            await sim.ready()
            d = await _deploy(bootstrap, sim, workdir, partitions)
            group = _Group(d.env, d.run_dir, time.monotonic())
            for _ in range(moves):
                group.start(0)
                await _wait_assigned(group, time.monotonic() + 120)
                await group.stop([0])
            callbacks = [
                a["ended"] - a["began"]
                for life in group.lives
                for a in parse_log(life.proc.log_path).assignments
                if a["ended"] is not None
            ]
        finally:
            sim.stop()
    return {
        "partitions": partitions,
        "moves": moves,
        "callback_s": [round(c, 2) for c in callbacks],
    }


# ---------------------------------------------------------------------- the run


@dataclass(slots=True)
class _Deploy:
    settings: Settings
    env: dict[str, str]
    outcome_topics: list[str]
    tools: list[str]
    run_dir: Path


async def _deploy(bootstrap: str, sim: SimProcess, workdir: Path, partitions: int) -> _Deploy:
    prefix = f"churn-{secrets.token_hex(3)}."
    run_dir = Path(tempfile.mkdtemp(prefix="run-", dir=workdir))
    settings = Settings(
        bootstrap_servers=bootstrap, topic_prefix=prefix, partitions=partitions, spec=SPEC
    )
    spec = load_spec(SPEC)
    await ensure_product_topics(bootstrap, settings, spec)
    tools = activity_topics(settings, spec)
    # The review topic is read by the audit whether or not the spec reviews calls.
    await ensure_topics(bootstrap, [settings.topics.review], partitions)
    env = {
        "STREAM_BOOTSTRAP_SERVERS": bootstrap,
        "STREAM_TOPIC_PREFIX": prefix,
        "STREAM_PARTITIONS": str(partitions),
        "STREAM_LLM_BASE_URL": f"{sim.url}/v1",
        "STREAM_LLM_MODEL": MODEL_NAME,
        "STREAM_SPEC": str(SPEC),
        "STREAM_DATA_DIR": str(run_dir / "data"),
        "STREAM_LOG_LEVEL": "INFO",
        "STREAM_LOG_FORMAT": "json",
        "STREAM_DELIVERY": "exactly_once",
    }
    outcome = [*tools, settings.topics.review, settings.topics.no_action]
    outcome.append(settings.topics.dead_letter)
    return _Deploy(settings, env, outcome, tools, run_dir)


def _items(n: int, tag: str) -> list[dict[str, str]]:
    return [{**t, "_instance": f"{tag}{t['_instance']}"} for t in tickets(n)]


async def _settle(watch: _Watch, inputs: int, until: float, group: _Group | None = None) -> bool:
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
    d = await _deploy(bootstrap, sim, workdir, plan.partitions)
    items = _items(max(10, int(plan.rate * plan.steady_s)), "s-")
    worker = _Worker(d.env, d.run_dir / "activities.log")
    worker.start()
    origin = time.monotonic()
    group = _Group(d.env, d.run_dir, origin)
    group.start(0)
    t = d.settings.topics
    try:
        async with _Watch(bootstrap, d.outcome_topics, t.input, t.done) as watch:
            await _wait_assigned(group, origin + 90)
            before = await sim.stats()
            until = time.monotonic() + plan.steady_s + 30
            sent = await _produce(bootstrap, t.input, items, plan.rate, origin, until)
            settled = await _settle(
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
        "requests_per_item": round(asked / max(len(sent), 1), 4),
        "settled": settled,
    }


async def _wait_assigned(group: _Group, until: float) -> bool:
    """Until every running processor's log shows an assignment callback finished."""
    while time.monotonic() < until:
        group.sample()
        if all(
            any(a["ended"] for a in parse_log(life.proc.log_path).assignments)
            for life in group.running.values()
        ):
            return True
        await asyncio.sleep(0.5)
    return False


async def _churn(
    bootstrap: str, sim: SimProcess, workdir: Path, plan: ChurnPlan, say: Any
) -> dict[str, Any]:
    d = await _deploy(bootstrap, sim, workdir, plan.partitions)
    t = d.settings.topics
    changelog = state_changelog(d.settings)
    wrote = await write_states(bootstrap, changelog, plan.partitions, plan.states)
    sample = [rec.value async for rec in _first_records(bootstrap, changelog)]
    wrote["store_format"] = bool(sample) and all(_same_format(v) for v in sample if v)
    say(f"churn: {plan.states} states written in {wrote['seconds']} s ({wrote['mean_bytes']} B)")
    worker = _Worker(d.env, d.run_dir / "activities.log")
    worker.start()
    origin = time.monotonic()
    wall_origin = time.time()
    group = _Group(d.env, d.run_dir, origin)
    moves: list[dict[str, Any]] = []
    crashes: list[str] = []
    group.start(0)
    result: dict[str, Any] = {"states_written": wrote}
    try:
        roll = _Roll(bootstrap, f"{d.settings.topic_prefix}{d.settings.app_id}", origin)
        async with (
            _Watch(bootstrap, d.outcome_topics, t.input, t.done) as watch,
            roll,
        ):
            assigned = await _wait_assigned(
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
                _produce(bootstrap, t.input, items, plan.rate, origin, flow_start + flow_s)
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
            settled = await _settle(watch, len(sent), settle_until, group)
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
    result.update(
        items=len(sent),
        flow_s=round(flow_end, 1),
        settled=settled,
        settle_s=round(end - flow_end, 1),
        requests=int(asked),
        item_asks=int(instances),
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
    result.update(_from_logs(group, wall_origin))
    # The broker's view and the processors' own (a new member id after an expulsion):
    # the larger count stands, both are shown.
    expelled = roll.expelled(group.lives)
    result["expelled"] = expelled
    result["group_polls"] = {"answered": len(roll.polls), "failed": roll.failed}
    result["expulsions_in_logs"] = result["expulsions"]
    result["expulsions"] = max(result["expulsions"], len(expelled))
    _rebalance_times(moves, group, wall_origin)
    result["audit"] = await _audit(bootstrap, d, len(sent))
    return result


async def _first_records(bootstrap: str, topic: str, n: int = 5) -> Any:
    """A few records of the changelog as a consumer reads them."""
    count = 0
    async for rec in read_topic(bootstrap, topic):
        yield rec
        count += 1
        if count >= n:
            return


def resume(
    sent: dict[tuple[int, int], float],
    first: dict[tuple[int, int], float],
    moves: list[dict[str, Any]],
    end: float,
    partitions: int,
) -> dict[str, Any]:
    """Per move and partition, the longest stall within the move's window (until the
    next move): if it is longer than the noise of the steady flow before the first
    move (twice its longest stall, 3 s at least), the partition stopped, and it resumed
    at that stall's end; `resume_s` is the latest such end minus the move. A partition
    still waiting at the end never resumed (None). Also the throughput inside and
    outside those windows."""
    gaps = stalls(sent, first, end)
    before = [b - a for p in gaps for a, b in gaps[p] if moves and b <= moves[0]["at_s"]]
    noise = max(3.0, 2 * max(before, default=0.0))
    windows: list[tuple[float, float]] = []
    worst: float | None = 0.0
    for k, move in enumerate(moves):
        m = move["at_s"]
        nxt = moves[k + 1]["at_s"] if k + 1 < len(moves) else end
        resumed: dict[int, float] = {}
        stuck: list[int] = []
        for p in range(partitions):
            spans = [(a, b) for a, b in gaps.get(p, []) if b > m and a < nxt]
            if any(b >= end for _, b in spans):
                stuck.append(p)
                continue
            a, b = max(spans, key=lambda s: min(s[1], nxt) - max(s[0], m), default=(m, m))
            resumed[p] = round(b - m, 1) if min(b, nxt) - max(a, m) > noise else 0.0
        longest = max(resumed.values(), default=0.0)
        move["resume_s"] = None if stuck else longest
        move["partitions_stuck"] = stuck
        move["slowest"] = sorted(resumed, key=lambda p: -resumed[p])[:3]
        windows.append((m, nxt if stuck else min(m + longest, nxt)))
        if stuck:
            worst = None
        elif worst is not None:
            worst = max(worst, longest)
    outcomes = sorted(v for k, v in first.items() if k in sent)
    flow_start = min(sent.values(), default=0.0)
    flow_end = max(sent.values(), default=0.0)
    # Inside the flow only: after it, what is left is the backlog's drain.
    windows = [(a, min(b, flow_end)) for a, b in windows if a < flow_end]
    inside = sum(b - a for a, b in windows)
    total = max(flow_end - flow_start, 1e-6)
    during = sum(1 for v in outcomes if any(a <= v < b for a, b in windows))
    outside = sum(
        1
        for v in outcomes
        if flow_start <= v < flow_end and not any(a <= v < b for a, b in windows)
    )
    return {
        "max_resume_s": worst,
        "items_per_s_during_moves": round(during / inside, 2) if inside > 0 else None,
        "items_per_s_outside_moves": round(outside / max(total - inside, 1e-6), 2),
        "moves_window_s": round(inside, 1),
        "longest_stall_before_first_move_s": round(max(before, default=0.0), 1),
        "stall_noise_s": round(noise, 1),
    }


def _rebalance_times(moves: list[dict[str, Any]], group: _Group, wall_origin: float) -> None:
    """Each move's first revocation in any processor's log: the rebalance began there
    (a scale-up's processes first start, import and probe the model), and the resume
    counted from it."""
    revokes = sorted(
        at - wall_origin for life in group.lives for at in parse_log(life.proc.log_path).revoking
    )
    for k, move in enumerate(moves):
        nxt = moves[k + 1]["at_s"] if k + 1 < len(moves) else float("inf")
        began = next((r for r in revokes if move["at_s"] <= r < nxt), None)
        move["rebalance_began_s"] = None if began is None else round(began, 1)
        resume = move.get("resume_s")
        move["resume_after_rebalance_s"] = (
            None
            if began is None or resume is None
            else round(max(0.0, move["at_s"] + resume - began), 1)
        )


def _from_logs(group: _Group, wall_origin: float) -> dict[str, Any]:
    restore: list[dict[str, Any]] = []
    processors: list[dict[str, Any]] = []
    expulsions = 0
    for life in group.lives:
        facts = parse_log(life.proc.log_path)
        expulsions += facts.expulsions
        for a in facts.assignments:
            parts = {
                str(p): {"s": round(at - a["began"], 2), "states": n}
                for p, (at, n) in sorted(a["restored"].items())
            }
            restore.append(
                {
                    "processor": life.name,
                    "at_s": round(a["began"] - wall_origin, 1),
                    "callback_s": None if a["ended"] is None else round(a["ended"] - a["began"], 2),
                    "partitions": len(parts),
                    "states": sum(v["states"] for v in parts.values()),
                    "per_partition": parts,
                }
            )
        processors.append(
            {
                "name": life.name,
                "started_s": round(life.started_s, 1),
                "stopped_s": None if life.stopped_s is None else round(life.stopped_s, 1),
                "peak_rss_mb": round(life.peak_rss_mb, 1),
                "exit_code": life.exit_code,
                "needed_sigkill": life.killed,
                "expulsions": facts.expulsions,
                "unknown_member_lines": facts.unknown_member,
                "assignments": len(facts.assignments),
                "errors": facts.errors[:5],
                "log": str(life.proc.log_path),
            }
        )
    restores = [r for r in restore if r["partitions"]]
    return {
        "expulsions": expulsions,
        "restore_s": restores,
        "restore_max_callback_s": max(
            (r["callback_s"] for r in restores if r["callback_s"] is not None), default=None
        ),
        "assignments_unfinished": sum(1 for r in restore if r["callback_s"] is None),
        "rss_mb": {p["name"]: p["peak_rss_mb"] for p in processors},
        "processors": processors,
    }


async def _audit(bootstrap: str, d: _Deploy, inputs: int) -> dict[str, Any]:
    report = await audit(bootstrap, d.settings.topics, d.tools)
    per_input = await per_input_outcomes(bootstrap, d.settings, d.tools)
    return {
        "inputs": report.inputs,
        "missing": report.unaccounted,
        "duplicate_call_ids": report.duplicate_calls,
        **per_input,
        "expected_inputs": inputs,
    }


def _keep(workdir: Path, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for log in workdir.glob("run-*/*.log"):
        (folder / f"{log.parent.name}-{log.name}").write_bytes(log.read_bytes())


@contextlib.contextmanager
def _workdir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="stream-churn-") as tmp:
        yield Path(tmp)


async def run_churn(
    bootstrap: str, plan: ChurnPlan, say: Any = print, keep_logs: Path | None = None
) -> dict[str, Any]:
    """The steady run, then the churn run; the report churn.json holds. `keep_logs`:
    a folder the processors' logs are copied to before the work folder goes."""
    with _workdir() as workdir:
        sim = SimProcess(workdir)
        sim.start()
        try:
            await sim.ready()
            await sim.configure(Endpoint(plan.latency_ms, 1.0, 32, 20_000_000).config())
            steady = await _steady(bootstrap, sim, workdir, plan, say)
            churn = await _churn(bootstrap, sim, workdir, plan, say)
            inits = await init_transactions(bootstrap, plan.partitions)
        finally:
            sim.stop()
            if keep_logs is not None:
                _keep(workdir, keep_logs)
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
        },
        "elapsed_s": round(time.monotonic() - plan.started, 1),
    }


def churn_command(args: Any, settings: Settings) -> int:
    """`stream bench --churn`: the broker (or the configured one), the runs, churn.json."""
    from instanced_stream.testing.broker import kafka_bootstrap

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
    keys += ("missing", "duplicate_outcomes", "elapsed_s")  # type: ignore[assignment]
    print(" ".join(f"{k}={report[k]}" for k in keys))
    return 0
