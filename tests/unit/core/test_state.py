"""An instance's state record (core/state.py) across versions: a record written by an
older version, with fields this one no longer has, still loads (from the model and
through a unit store's restore), and a record written now carries only today's fields."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from instanced_stream.core.state import InstanceState
from instanced_stream.kafka import clients
from instanced_stream.runtime.state.store import UnitStore

from tests.fakes import ChangelogRecord, FakeChangelog

# A waiting workflow's record as versions before the transactional state store wrote it: the
# records its last change still had to publish (`outbox`) and who wrote them.
OLD = {
    "instance": "t-000007",
    "partition": 0,
    "source": {"topic": "items", "partition": 0, "offset": 7, "key": "t-000007"},
    "input": {"subject": "refund", "customer": "c-9"},
    "state": {"customer": {"tier": "gold"}},
    "turn": 2,
    "status": "pending",
    "pending": {
        "items/0/7/2/routeTicket/0": {
            "tool": "routeTicket",
            "paths": ["†state.route"],
            "deadline": 1_900_000_000.0,
            "turn": 2,
        }
    },
    "applied": ["turn1@items/0/7", "turn2@items/0/7"],
    "outbox": [
        {"topic": "activity.routeTicket", "value": '{"call_id": "x"}', "partition": 0},
        {"topic": "stream.done", "value": "{}", "partition": None},
    ],
    "ended": None,
    "owner": "a1b2c3",
    "outbox_owner": "a1b2c3",
}
DROPPED = {"outbox", "outbox_owner"}


def _fields(raw: bytes) -> set[str]:
    found: dict[str, Any] = orjson.loads(raw)
    return set(found)


def test_an_old_record_loads_without_its_dropped_fields() -> None:
    st = InstanceState.model_validate_json(orjson.dumps(OLD))
    assert st.instance == "t-000007" and st.turn == 2 and st.status == "pending"
    assert list(st.pending) == ["items/0/7/2/routeTicket/0"]
    assert st.state == {"customer": {"tier": "gold"}} and st.owner == "a1b2c3"
    assert not DROPPED & set(InstanceState.model_fields)
    # written again, it carries every field it was read with but the dropped ones
    assert _fields(st.model_dump_json().encode()) == set(OLD) - DROPPED | {
        "proposal",
        "proposal_id",
        "trace",
        "plan",
        "revisions",
        "revising",
        "counts",
    }


def test_a_new_record_does_not_write_the_dropped_fields() -> None:
    st = InstanceState(instance="t-1", partition=0, status="done")
    raw = st.model_dump_json().encode()
    assert not DROPPED & _fields(raw)
    assert InstanceState.model_validate_json(raw) == st


async def test_a_store_restores_an_old_record_and_writes_it_back_in_the_new_shape(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    old = ChangelogRecord(b"t-000007", orjson.dumps(OLD), 0)
    monkeypatch.setattr(clients, "consumer", lambda bootstrap: FakeChangelog([old]))
    store = UnitStore("changelog", 0, 1_000_000)
    assert await store.restore("unused:9092") == 1
    assert store.quarantined == []  # read, not set aside as unreadable
    st = store.get("t-000007")
    assert st is not None and st.turn == 2 and st.applied == OLD["applied"]
    st.state["route"] = "priority"
    record = store.put(st)
    assert not DROPPED & _fields(record.value)
    assert orjson.loads(record.value)["state"] == {
        "customer": {"tier": "gold"},
        "route": "priority",
    }
