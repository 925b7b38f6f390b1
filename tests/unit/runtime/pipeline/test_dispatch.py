"""Dispatch (runtime/pipeline/dispatch.py): a closed window launched as one batch, solved,
retried, and handed to staging; a batch none of whose units is alive is orphaned."""

from __future__ import annotations

import asyncio

import orjson
import pytest
from instanced_stream.core.spec import load_spec
from instanced_stream.retry import RetryPolicy
from instanced_stream.runtime.pipeline import dispatch
from instanced_stream.runtime.pipeline.dispatch import BATCH_TRIES, retried
from instanced_stream.settings import DEFAULT_SPEC

from tests.flows import TICKETS, Rig


async def test_a_step_that_raises_is_retried_then_its_error_returned(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(dispatch, "_BACKOFF", RetryPolicy(base_s=0.0, cap_s=0.0))
    tries: list[int] = []

    async def step() -> int:
        tries.append(1)
        raise ValueError("a bug")

    got = await retried("b-1", "solving", step)
    assert isinstance(got, ValueError) and len(tries) == BATCH_TRIES


async def test_a_closed_window_is_one_batch_staged_on_its_items_units() -> None:
    rig = Rig(load_spec(DEFAULT_SPEC), max_record_bytes=1000)
    for i in range(3):
        value = orjson.dumps({"_instance": f"p-{i}", "comment": f"lovely {i}"})
        await rig.offer(value, 0, i)
    await rig.stager.windower.flush()  # its on_close is Dispatch.launch
    assert rig.stager.dispatch.batches == 1
    [items] = rig.stager.dispatch.tasks.values()
    assert [i.instance.id for i in items] == ["p-0", "p-1", "p-2"]
    await asyncio.gather(*list(rig.stager.dispatch.tasks))
    await rig.drain()
    assert rig.offsets() == {0: 3}


async def test_a_batch_in_flight_finishes_on_the_spec_it_was_launched_with() -> None:
    """A change of spec while a batch is launched and not yet asked: that batch is asked on
    the spec it was launched with (its system prompt), the next one on the new one."""
    rig = Rig(load_spec(DEFAULT_SPEC), max_record_bytes=1000)
    old = rig.live.spec
    await rig.offer(orjson.dumps({"_instance": "p-0", "comment": "lovely 0"}), 0, 0)
    await rig.stager.windower.flush()  # launched: its task is made, nothing asked yet
    new = old.model_copy(update={"instructions": "Moderate strictly, say why."})
    rig.live.install(new)
    await asyncio.gather(*list(rig.stager.dispatch.tasks))
    await rig.offer(orjson.dumps({"_instance": "p-1", "comment": "lovely 1"}), 0, 1)
    await rig.stager.windower.flush()
    await asyncio.gather(*list(rig.stager.dispatch.tasks))
    await rig.drain()
    systems = [messages[0]["content"] for messages in rig.llm.messages]
    assert len(systems) == 2
    assert "Moderate strictly" not in systems[0] and "Moderate strictly" in systems[1]
    assert rig.offsets() == {0: 2}


def test_a_batch_s_turns_are_made_on_the_spec_it_was_launched_with() -> None:
    """A stateful batch's turns are made on its edition, as its records are built, not on
    a spec installed while it was asked."""
    rig = Rig(load_spec(TICKETS))
    launched = rig.live.edition
    rig.live.install(launched.spec.model_copy(update={"instructions": "Triage, say why."}))
    tx, flow = rig.stager.dispatch._turns(launched)
    assert tx is not None and flow is not None
    assert flow.spec is launched.spec and flow.store is tx
    assert rig.workflow.spec is rig.live.spec is not launched.spec  # the others: the live one
