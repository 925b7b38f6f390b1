"""The batch ledger: a submitted line is recorded at the partition of every instance it
asks about, found again by its keys, and its tombstone rides on the slot of each
partition's last item (committed with the last of them, never before)."""

from __future__ import annotations

from typing import Any, cast

import orjson
from instanced_stream.core.instance import Instance
from instanced_stream.core.messages import SourcePosition
from instanced_stream.llm.batch_api import BatchModel
from instanced_stream.runtime.batch_api.ledger import Ledger, Line, partition_of
from instanced_stream.runtime.batch_api.submissions import Submissions
from instanced_stream.runtime.pipeline.staged import Staged
from instanced_stream.runtime.units.unit import Unit


def _inst(partition: int, offset: int) -> Instance:
    return Instance(
        f"i{partition}-{offset}",
        {},
        SourcePosition(topic="items", partition=partition, offset=offset),
        1,
    )


class _Model:
    """What Submissions asks of the model."""

    on_submitted: Any = None

    def __init__(self) -> None:
        self.forgotten: list[str] = []

    def forget(self, keys: list[str]) -> None:
        self.forgotten += keys


def test_a_line_is_recorded_at_each_partition_it_asks_about() -> None:
    ledger = Ledger("batches")
    keys = (_inst(0, 5).key, _inst(1, 7).key, _inst(0, 6).key)
    records = ledger.submitted("batch_1", [("req-a", keys)])
    assert sorted(records) == [0, 1]
    for partition, recs in records.items():
        [rec] = recs
        assert rec.partition == partition and rec.key == b"req-a"
        assert orjson.loads(rec.value)["keys"] == list(keys)
    line = ledger.first_line(keys[1])
    assert line is not None and line.batch == "batch_1"
    assert Line.parse("req-a", records[0][0].value).keys == keys
    assert partition_of(keys[1]) == 1


def test_a_later_line_of_the_same_keys_follows_the_first() -> None:
    ledger = Ledger("batches")
    a, b = _inst(0, 1).key, _inst(0, 2).key
    ledger.submitted("batch_1", [("req-a", (a, b))])
    ledger.submitted("batch_2", [("req-b", (b,))])  # a re-ask of b
    first = ledger.first_line(b)
    assert first is not None and first.custom_id == "req-a"
    tombstones = ledger.settled([a, b])
    assert sorted(r.key or b"" for r in tombstones[0]) == [b"req-a", b"req-b"]
    assert all(r.value == b"" for r in tombstones[0])
    assert ledger.first_line(b) is None and len(ledger) == 0


def test_the_tombstone_rides_on_the_slot_of_each_partitions_last_item() -> None:
    ledger = Ledger("batches")
    units = {p: Unit(p, cast(Any, None), group_id="g", transactional=True) for p in (0, 1)}
    model = _Model()
    subs = Submissions(ledger, cast(BatchModel, model), units.get)
    items = []
    for partition, offset in ((0, 3), (0, 9), (0, 4), (1, 2)):
        unit = units[partition]
        items.append(Staged(_inst(partition, offset), unit, unit.track("items", offset), b""))
    subs.submitted("batch_1", [("req-a", tuple(i.instance.key for i in items))])
    carried = subs.settled(items)
    last_of_0, last_of_1 = items[1], items[3]
    assert set(carried) == {id(last_of_0), id(last_of_1)}
    assert [r.partition for r in carried[id(last_of_0)]] == [0]
    assert [r.partition for r in carried[id(last_of_1)]] == [1]
    assert sorted(model.forgotten) == sorted(i.instance.key for i in items)
