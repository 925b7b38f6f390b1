"""`stream eval` against the simulator over HTTP: figures per window size that add up."""

from __future__ import annotations

from pathlib import Path

import pytest
from instanced_stream.core.spec import load_spec
from instanced_stream.llm.client import LLM
from instanced_stream.settings import DEFAULT_SPEC
from instanced_stream_bench.harness.eval import evaluate, load_items, markdown
from instanced_stream_bench.testing.sim.server import Simulator

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

SAMPLE = Path(__file__).resolve().parents[2] / "examples" / "moderation" / "eval.jsonl"


async def test_eval_reports_agreement_accuracy_and_cost_per_window(
    simulator: tuple[Simulator, str], capsys: pytest.CaptureFixture[str]
) -> None:
    _, url = simulator
    spec = load_spec(DEFAULT_SPEC)
    items = load_items(SAMPLE)
    assert len(items) >= 80 and all(it.label for it in items)
    assert all(not k.startswith("_") for it in items for k in it.payload)  # labels stay out
    llm = LLM(base_url=url, api_key="simulator", model=spec.model.name, timeout_s=30)
    try:
        reports = await evaluate(spec, llm, items, [10, 50], show_progress=True)
    finally:
        await llm.close()
    # progress on stderr as it goes (plain lines off a terminal), nothing on stdout
    shown = capsys.readouterr()
    assert shown.out == ""
    for window in (1, 10, 50):
        assert f"eval window {window}: {len(items)}/{len(items)} items (100%)" in shown.err
    assert shown.err.count("eval window 1:") <= 11  # a line per tenth at most
    assert [r.window for r in reports] == [1, 10, 50]
    one, ten, fifty = reports
    assert one.agreement == 1.0
    assert all(r.agreement is not None and 0 <= r.agreement <= 1 for r in reports)
    assert all(r.accuracy is not None and 0.7 <= r.accuracy <= 1 for r in reports)
    assert one.requests >= len(items)  # one call per item, follow-ups on top
    assert one.per_item(one.requests) > ten.per_item(ten.requests) > fifty.per_item(fifty.requests)
    assert one.per_item(one.prompt_tokens) > 4 * fifty.per_item(fifty.prompt_tokens)
    assert one.per_item(one.cost_usd) > fifty.per_item(fifty.cost_usd) > 0
    assert len(one.latencies) == one.requests and fifty.latency(0.5) <= fifty.latency(0.99)
    table = markdown(reports, "eval.jsonl", spec.model.name)
    assert table.count("\n| ") == 4  # header and three sizes
