"""A state change as one transaction (runtime/state/transaction.py): its writes reach the
stores on a clean exit, with their changelog records, or not at all; the stores take no
write outside one; a batch's turns are made once, on the transaction its records are
built over."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from instanced_stream.core.spec import load_spec
from instanced_stream.core.state import InstanceState, Write
from instanced_stream.core.workflow import Workflow
from instanced_stream.errors import BadRecord
from instanced_stream.runtime.state.changes import last_change
from instanced_stream.runtime.state.store import OutsideChange, Stores, UnitStore
from instanced_stream.runtime.state.transaction import Transaction
from instanced_stream_bench.testing.samples import tickets

from tests.flows import TICKETS, Rig


def _stores(max_bytes: int = 1_000_000) -> Stores:
    stores = Stores()
    stores.add(UnitStore("changelog", 0, max_bytes))
    stores.add(UnitStore("changelog", 1, max_bytes))
    return stores


def _state(name: str, partition: int = 0, **state: Any) -> InstanceState:
    return InstanceState(instance=name, partition=partition, state=state)


def test_a_change_is_stored_with_its_records_on_a_clean_exit_only() -> None:
    stores = _stores()
    told: list[list[Write]] = []
    with stores.change().followed_by(lambda w: told.append(list(w))) as tx:
        tx.put(_state("a", 0, n=1))
        tx.put(_state("b", 1, n=2))
        tx.put(_state("a", 0, n=3))  # the same instance again: its last state is written
        assert tx.get("a") == _state("a", 0, n=3)  # the change reads its own writes
        assert stores.get("a") is None and stores.get("b") is None  # the stores, none
    assert stores.get("a") == _state("a", 0, n=3) and stores.get("b") == _state("b", 1, n=2)
    assert [(r.partition, r.key) for r in tx.records] == [(0, b"a"), (1, b"b")]
    assert orjson.loads(tx.by_partition[0][0].value or b"")["state"] == {"n": 3}
    assert tx.by_partition[1][0].seq == last_change()  # in the order the change was made
    assert [[w.instance for w in writes] for writes in told] == [["a", "b"]]


def _change(stores: Stores, *states: InstanceState, fail: bool = False) -> Transaction:
    tx = stores.change()
    with tx:
        for st in states:
            tx.put(st)
        if fail:
            raise RuntimeError("a bug")
    return tx


def test_an_error_inside_the_change_stores_nothing() -> None:
    stores = _stores()
    with pytest.raises(RuntimeError, match="a bug"):
        _change(stores, _state("a"), fail=True)
    assert stores.get("a") is None


def test_a_state_past_the_broker_s_limit_refuses_the_whole_commit() -> None:
    stores = _stores(max_bytes=400)
    with pytest.raises(BadRecord, match="changelog record takes at most 400"):
        _change(stores, _state("small"), _state("large", text="x" * 500))
    assert stores.get("small") is None and stores.get("large") is None
    assert _change(stores, _state("small")).records != []  # alone, it fits


def test_a_batch_commits_item_by_item_and_a_deletion_is_a_tombstone() -> None:
    stores = _stores()
    with stores.change() as tx:
        tx.put(_state("a"))
    tx = stores.change()
    tx.delete("a", 0)
    tx.put(_state("b"))
    (tombstone,) = tx.commit("a")
    assert tombstone.key == b"a" and tombstone.value == b"" and stores.get("a") is None
    assert stores.get("b") is None and tx.names == ["b"]  # not committed yet
    assert [r.key for r in tx.commit("b")] == [b"b"] and stores.get("b") is not None
    assert tx.commit("b") == []  # taken: a second commit writes nothing


def test_the_stores_take_no_write_outside_a_change() -> None:
    stores = _stores()
    with pytest.raises(OutsideChange):
        stores.put(_state("a"))
    with pytest.raises(OutsideChange):
        stores.delete("a", 0)


async def test_each_turn_of_a_stateful_batch_runs_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before, a batch's turns were played on a rehearsal while its records were built,
    then applied again when staged: the turn now runs once, on a transaction that staging
    stores with the item's records."""
    made: list[str] = []
    turn = Workflow.turn

    def counted(self: Workflow, inst: Any, *args: Any, **kw: Any) -> Any:
        made.append(inst.id)
        return turn(self, inst, *args, **kw)

    monkeypatch.setattr(Workflow, "turn", counted)
    rig = Rig(load_spec(TICKETS))
    assert rig.flows is not None
    items = tickets(3)
    for ticket in items:
        await rig.offer(orjson.dumps(ticket))
    await rig.drain()
    names = sorted(t["_instance"] for t in items)
    assert sorted(made) == names  # one turn each
    changelog = [r for r in rig.records if r.topic == rig.flows.changelog]
    assert {r.key for r in changelog} == {n.encode() for n in names}  # admissions, turns
    for name in names:
        state = await rig.state(name)
        assert state is not None and state.turn == 1 and len(state.trace) == 1
