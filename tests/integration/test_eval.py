"""`stream eval` against the simulator over HTTP: figures per window size that add up."""

from __future__ import annotations

from pathlib import Path

import pytest
from instanced_stream.core.cache_rule import PRESETS
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
    sim, url = simulator
    spec = load_spec(DEFAULT_SPEC)
    items = load_items(SAMPLE)
    assert len(items) >= 80 and all(it.label for it in items)
    assert all(not k.startswith("_") for it in items for k in it.payload)  # labels stay out
    llm = LLM(base_url=url, api_key="simulator", model=spec.model.name, timeout_s=30)
    try:
        reports = await evaluate(
            spec, llm, items, [10, 50], show_progress=True, counts=lambda: sim.stats
        )
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
    sizes, _, rest = table.partition("under each provider's cache rule")
    rules, _, parts = rest.partition("by who wrote them")
    assert sizes.count("\n| ") == 4  # header and three sizes
    # ... and the same tokens billed under every preset: window 50 cheaper under each,
    # least under 0.1x (the per-item requests' shared prefix is mostly cached there)
    assert rules.count("\n| ") == 4 and set(one.cost_by_rule) == set(PRESETS)
    shares = {k: fifty.cost_by_rule[k] / one.cost_by_rule[k] for k in PRESETS}
    assert all(share < 1 for share in shares.values())
    assert shares["no-cache"] < shares["openai-0.5x"] < shares["openai-0.1x"]
    # Who wrote the answer: the instanced advisor's opinion is paid per item at every
    # window, the request-wide one once per window, so it fades as windows grow.
    officer = [r.per_item(r.answer_parts["safetyOfficer"]) for r in (one, fifty)]
    manager = [r.per_item(r.answer_parts["communityManager"]) for r in (one, fifty)]
    assert officer[0] > 0 and officer[1] > 0.8 * officer[0]
    assert manager[1] < manager[0] / 10
    assert parts.count("\n| ") == 4  # the same sizes, each advisor and the calls
    total = sum(fifty.answer_parts.values())
    assert total == pytest.approx(fifty.completion_tokens, rel=0.05)
