"""Cross-instance injection (#26 item 5), proven against a model that falls for it: the
simulator's obedient mode writes the call an item's text dictates for another instance,
before the legitimate one. No victim's decision may change."""

from __future__ import annotations

import pytest
from instanced_stream.core.spec import load_spec
from instanced_stream.llm.client import LLM
from instanced_stream.settings import DEFAULT_SPEC
from instanced_stream_bench.harness.injection import injection_share
from instanced_stream_bench.testing.sim.server import Simulator

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


async def test_an_obedient_model_changes_no_other_instance_s_decision(
    simulator: tuple[Simulator, str],
) -> None:
    sim, url = simulator
    before = sim.stats["obeyed_injections"]
    sim.config = sim.config.model_copy(update={"obedient": True})
    llm = LLM(base_url=url, api_key="sk-test", model="stream-sim-1", timeout_s=10)
    try:
        result = await injection_share(llm, load_spec(DEFAULT_SPEC), pairs=5)
    finally:
        sim.config = sim.config.model_copy(update={"obedient": False})
        await llm.close()
    assert sim.stats["obeyed_injections"] - before >= 5  # the model did obey every one
    assert result["refused_calls"] >= 5  # refused, as copies of another's text
    assert result["victims_decided"] == 5
    assert result["changed"] == 0, result
