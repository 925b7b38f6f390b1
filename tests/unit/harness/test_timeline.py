"""The churn bench's figures from their raw material: stalls from produced records and
first outcomes, rebalance facts from a processor's JSON log, states in the store's format."""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import orjson
from instanced_stream.core.state import InstanceState
from instanced_stream_bench.harness.changelog_states import done_state
from instanced_stream_bench.harness.rebalances import parse_log
from instanced_stream_bench.harness.timeline import resume, stalls


def test_a_stall_runs_from_the_oldest_waiting_input_to_the_next_outcome() -> None:
    # Partition 0: items sent at 1, 2 and 3; the first decided at 1.5, then nothing
    # until 9 (a rebalance), the third at 9.5. Partition 1: its one item, never decided.
    sent = {(0, 0): 1.0, (0, 1): 2.0, (0, 2): 3.0, (1, 0): 4.0}
    first = {(0, 0): 1.5, (0, 1): 9.0, (0, 2): 9.5}
    gaps = stalls(sent, first, end=20.0)
    assert gaps[0] == [(1.0, 1.5), (2.0, 9.0), (9.0, 9.5)]
    assert gaps[1] == [(4.0, 20.0)]  # still waiting at the end: runs to `end`


def test_an_idle_partition_has_no_stall() -> None:
    sent = {(0, 0): 1.0}
    first = {(0, 0): 1.2}
    assert stalls(sent, first, end=30.0) == {0: [(1.0, 1.2)]}


def _line(ts: float, message: str, level: str = "INFO") -> bytes:
    when = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts)) + f".{int(ts % 1 * 1000):03d}Z"
    return orjson.dumps({"ts": when, "level": level, "message": message})


def test_the_log_gives_expulsions_and_restore_times(tmp_path: Path) -> None:
    t = 1_800_000_000.0
    log = tmp_path / "processor.log"
    log.write_bytes(
        b"\n".join(
            [
                _line(t, "Joined group 'g' (generation 1) with member_id m-1"),
                _line(t + 1, "Revoking previously assigned partitions set() for group g"),
                _line(t + 2, "Setting newly assigned partitions {TopicPartition(...)} for group g"),
                _line(t + 5, "partition 3: 900 states restored, 0 workflows resume"),
                _line(t + 9, "partition 1: 800 states restored, 2 workflows resume"),
                _line(t + 9.5, "rebalance: partitions [1, 3] assigned"),
                _line(t + 30, "Heartbeat failed: local member_id was not recognized;", "WARNING"),
                _line(t + 31, "Joined group 'g' (generation 3) with member_id m-2"),
                b"Traceback (most recent call last):",
            ]
        )
    )
    facts = parse_log(log)
    assert facts.expulsions == 1 and facts.unknown_member == 1
    assert facts.revoking == [t + 1]
    (one,) = facts.assignments
    assert one["ended"] - one["began"] == 7.5
    assert {p: (at - one["began"], n) for p, (at, n) in one["restored"].items()} == {
        3: (3.0, 900),
        1: (7.0, 800),
    }
    assert facts.errors  # the traceback is kept, not parsed away


def test_a_prewritten_state_is_what_the_store_itself_would_write() -> None:
    raw = done_state("old-0000007", 5, time.time(), random.Random(1))
    state = InstanceState.model_validate_json(raw)
    assert state.status == "done" and state.ended is not None and state.partition == 5
    assert state.model_dump_json().encode() == raw  # UnitStore.put's bytes
    assert 2500 <= len(raw) <= 4000  # realistic, as issue 37's runs: about 3 KB


def test_resume_is_the_end_of_the_stall_a_move_caused() -> None:
    # One partition, an item a second decided 0.3 s later; a move at 10 s, after which
    # nothing is decided from 12 s until 20 s (the items of 12-19 s all at once).
    sent = {(0, k): float(k) for k in range(30)}
    first = {(0, k): k + 0.3 if not 12 <= k < 20 else 20.0 for k in range(30)}
    moves: list[dict[str, Any]] = [{"at_s": 10.0}]
    found = resume(sent, first, moves, end=40.0, partitions=1)
    assert moves[0]["resume_s"] == 10.0 and found["max_resume_s"] == 10.0
    # Short gaps late in the window are the flow's noise, not a stop.
    calm = {(0, k): k + 0.3 for k in range(30)}
    assert resume(sent, calm, [{"at_s": 10.0}], end=40.0, partitions=1)["max_resume_s"] == 0.0
    # An item never decided: the partition never resumed.
    stuck = {k: v for k, v in calm.items() if k != (0, 25)}
    assert resume(sent, stuck, [{"at_s": 10.0}], end=40.0, partitions=1)["max_resume_s"] is None
