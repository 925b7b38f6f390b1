"""A churn run's timeline: tickets produced at a fixed pace (when and where each
went), when each input's first outcome became visible read_committed, the group's members
as the broker describes them, and what follows from those: per partition the stalls (an
input waiting, nothing decided), per move the time until every partition decided again."""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from typing import Any

import orjson
from aiokafka import AIOKafkaProducer
from instanced_stream.kafka import clients

from instanced_stream_bench.harness.background import Background
from instanced_stream_bench.harness.fleet import Life
from instanced_stream_bench.harness.load import TopicReader

__all__ = ["Roll", "Watch", "produce_paced", "resume", "stalls"]


class Watch(TopicReader):
    """Reads the outcome and done topics read_committed as they fill: when each input's
    first outcome became visible, and which workflows ended."""

    def __init__(self, bootstrap: str, topics: list[str], input_topic: str, done: str) -> None:
        super().__init__(bootstrap, [*topics, done])
        self.input = input_topic
        self.done_topic = done
        self.first: dict[tuple[int, int], float] = {}
        self.ended: set[str] = set()

    def _take(self, found: dict[Any, list[Any]], now: float) -> None:
        for tp, records in found.items():
            for rec in records:
                self._seen(tp.topic, rec.value, now)

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


class Roll(Background):
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

    def expelled(self, lives: list[Life]) -> list[dict[str, Any]]:
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


async def produce_paced(
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
