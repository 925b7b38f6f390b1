"""A partition's Idea Process counts follow its committed states only (runtime/state/
idea_tally.py): the unit's commit carries the record of the counts after it, in the same
transaction; a change staged behind an unfinished slot is not counted until its own
commit; a restore counts what the changelog holds."""

from __future__ import annotations

import orjson
import pytest
from instanced_stream.core.plan_graph import Step
from instanced_stream.core.spec import Plan
from instanced_stream.core.state import InstanceState
from instanced_stream.runtime.state.idea_tally import IdeaShare, IdeaTally, idea_key
from instanced_stream.runtime.state.store import Stores, UnitStore
from instanced_stream.runtime.units.unit import Unit

from tests.fakes import FakeProducer

PLAN = Plan.model_validate({"mode": "eager", "goal": "triage", "steps": ["look up"]})


def _state(name: str, lookup: str, status: str = "pending") -> InstanceState:
    step = Step.model_validate(
        {
            "call_id": f"{name}-1",
            "tool": "lookup",
            "kind": "activity",
            "output": "†state.customer",
            "status": lookup,
        }
    )
    return InstanceState(instance=name, partition=3, status=status, plan=[step])


def _wired() -> tuple[FakeProducer, Unit, Stores, UnitStore]:
    producer = FakeProducer()
    unit = Unit(3, producer, group_id="g", transactional=True)
    stores, store = Stores(), UnitStore("changelog", 3, 1_000_000)
    stores.add(store)
    unit.written = stores.written
    unit.annex = IdeaShare(store.ideas, "changelog", "ideas", 3, lambda: PLAN)
    return producer, unit, stores, store


def _ideas(producer: FakeProducer) -> list[dict[str, object]]:
    return [orjson.loads(r.value or b"") for r in producer.records if r.topic == "ideas"]


def _counts(record: dict[str, object]) -> dict[str, int]:
    nodes = record["nodes"]
    assert isinstance(nodes, list)
    return dict(nodes[0]["counts"])


async def test_the_record_rides_the_commit_of_the_changes_it_counts() -> None:
    producer, unit, stores, _ = _wired()
    with stores.change() as tx:
        tx.put(_state("t-1", "running"))
        tx.put(_state("t-2", "running"))
    unit.stage(tx.records)
    await unit.commit()
    [record] = _ideas(producer)
    assert record["instances"] == 2 and _counts(record)["running"] == 2
    assert producer.records[-1].key == idea_key(record["edition"], 3)  # type: ignore[arg-type]
    # in the same transaction as the changelog records: begin, sends, commit
    kinds = [c[0] for c in producer.calls]
    assert kinds.count("begin") == 1 and kinds[-1] == "commit"


async def test_a_change_not_committed_yet_is_not_counted() -> None:
    producer, unit, stores, _ = _wired()
    first = unit.track("items", 0)
    second = unit.track("items", 1)
    with stores.change() as tx:
        tx.put(_state("t-1", "running"))
    with stores.change() as later:
        later.put(_state("t-2", "running"))
    unit.finish(second, later.records)  # behind an unfinished slot: not committed yet
    await unit.commit()
    assert _ideas(producer) == []  # nothing committed, nothing counted
    unit.finish(first, tx.records)
    await unit.commit()
    assert [r["instances"] for r in _ideas(producer)] == [2]


async def test_a_commit_that_changes_no_count_writes_no_record() -> None:
    producer, unit, stores, _ = _wired()
    for _ in range(2):
        with stores.change() as tx:
            tx.put(_state("t-1", "running"))
        unit.stage(tx.records)
        await unit.commit()
    assert len(_ideas(producer)) == 1
    with stores.change() as tx:
        tx.put(_state("t-1", "done", status="done"))
    unit.stage(tx.records)
    await unit.commit()
    last = _ideas(producer)[-1]
    assert _counts(last)["done"] == 1 and _counts(last)["running"] == 0
    assert last["by_status"] == {"done": 1}


def test_a_tally_forgets_a_deleted_state_and_the_nodes_nobody_counts() -> None:
    tally = IdeaTally()
    tally.set("t-1", _state("t-1", "done").model_dump_json().encode())
    assert len(tally) == 1 and tally.record(PLAN, 3).nodes[0].counts.done == 1
    tally.set("t-1", None)
    record = tally.record(PLAN, 3)
    assert (len(tally), record.instances, record.nodes) == (0, 0, [])


async def test_each_commit_counts_on_what_the_commits_before_it_counted() -> None:
    producer, unit, stores, _ = _wired()
    for name in ("t-1", "t-2", "t-3"):
        with stores.change() as tx:
            tx.put(_state(name, "running"))
        unit.stage(tx.records)
        await unit.commit()
    assert [r["instances"] for r in _ideas(producer)] == [1, 2, 3]


async def test_a_restore_counts_what_the_changelog_holds(monkeypatch: pytest.MonkeyPatch) -> None:
    store = UnitStore("changelog", 3, 1_000_000)
    latest = {
        "t-1": (0, _state("t-1", "done", status="done").model_dump_json().encode()),
        "t-2": (1, _state("t-2", "running").model_dump_json().encode()),
        "t-3": (2, None),  # deleted: not counted
    }

    async def read(*_: object) -> dict[str, tuple[int, bytes | None]]:
        return dict(latest)

    monkeypatch.setattr(store.changelog, "read", read)
    await store.restore("unused:9092")
    record = store.ideas.record(PLAN, 3)
    assert record.instances == 2 and record.by_status == {"done": 1, "pending": 1}
    assert (record.nodes[0].counts.done, record.nodes[0].counts.running) == (1, 1)
