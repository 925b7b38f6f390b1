"""Admission (runtime/pipeline/admission.py): a consumed record becomes an item for a
window, a plain value, or its outcome known at once (a dead letter), handed back for
staging to write; a next turn is one at a time."""

from __future__ import annotations

import orjson
from instanced_stream.core.instance import Instance
from instanced_stream.core.spec import load_spec
from instanced_stream.runtime.pipeline.intake import source_of
from instanced_stream.runtime.pipeline.staged import Settled, Staged
from instanced_stream.settings import DEFAULT_SPEC

from tests.flows import Rig


def _rig() -> Rig:
    return Rig(load_spec(DEFAULT_SPEC), max_record_bytes=1000)


async def test_a_good_record_is_returned_as_an_item_and_nothing_is_windowed_yet() -> None:
    rig = _rig()
    unit = rig.unit(0)
    slot = unit.track(rig.topics.input, 0)
    source = source_of(rig.topics.input, 0, 0, None, 0)
    value = orjson.dumps({"_instance": "p-1", "comment": "lovely"})
    item = await rig.stager.admission.record(unit, source, None, value, slot)
    assert isinstance(item, Staged) and item.instance.id == "p-1" and item.slot is slot
    assert len(rig.stager.windower) == 0  # the stager, not admission, hands it on


async def test_a_bad_record_is_handed_back_settled_and_only_staging_writes_it() -> None:
    rig = _rig()
    unit = rig.unit(0)
    slot = unit.track(rig.topics.input, 0)
    source = source_of(rig.topics.input, 0, 0, None, 0)
    settled = await rig.stager.admission.record(unit, source, None, b"{broken", slot)
    assert isinstance(settled, Settled) and settled.slot is slot
    assert not slot.done and not slot.records  # admission wrote nothing on the unit
    rig.stager.staging.settle(settled)
    assert slot.done
    await rig.drain()
    assert [d["code"] for d in rig.on("deadletter")] == ["not_json"]


def test_a_next_turn_is_an_item_once_while_it_is_on_its_way() -> None:
    rig = _rig()
    unit = rig.unit(0)
    source = source_of(rig.topics.input, 0, 0, None, 0)
    inst = Instance("p-1", {"comment": "hi"}, source, 10, turn=2)
    first = rig.stager.admission.turn(unit, inst)
    assert first is not None and first.slot is None
    assert rig.stager.admission.turn(unit, inst) is None
