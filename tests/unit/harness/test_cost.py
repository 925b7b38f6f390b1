"""Cost per item with cached prompt tokens priced as providers bill them."""

from __future__ import annotations

import pytest
from instanced_stream.core.spec import ModelEndpoint
from instanced_stream.observe.metrics import Metrics
from instanced_stream_bench.harness.report import Endpoint, Result, markdown

_PRICES = ModelEndpoint(
    price_input_per_million=0.15,
    price_output_per_million=0.60,
    price_cached_input_per_million=0.075,
)


def test_cached_prompt_tokens_cost_the_cached_price() -> None:
    # 1,000 prompt tokens of which 800 cached, 100 completion tokens
    expected = (200 * 0.15 + 800 * 0.075 + 100 * 0.60) / 1e6
    assert _PRICES.cost_usd(1000, 100, 800) == pytest.approx(expected)
    # more cached than prompt (a provider's rounding) cannot make tokens free
    assert _PRICES.cost_usd(100, 0, 500) == pytest.approx(100 * 0.075 / 1e6)


def test_without_a_cached_price_cached_tokens_cost_the_input_price() -> None:
    plain = ModelEndpoint(price_input_per_million=0.15, price_output_per_million=0.60)
    assert plain.cost_usd(1000, 100, 800) == pytest.approx(plain.cost_usd(1000, 100, 0))


def test_metrics_count_dollars_in_a_counter_that_rate_can_read() -> None:
    metrics = Metrics(_PRICES)
    metrics.observe_tokens(1000, 100, 800, answered=2)
    metrics.observe_tokens(1000, 100, 0, answered=2)
    total = _PRICES.cost_usd(1000, 100, 800) + _PRICES.cost_usd(1000, 100, 0)
    text = metrics.render().decode()
    line = next(
        x for x in text.splitlines() if x.startswith("instanced_stream_llm_cost_usd_total ")
    )
    assert float(line.split()[1]) == pytest.approx(total)
    assert metrics.live()["cost_per_item_usd"] == pytest.approx(total / 4, abs=1e-6)


def _row(text: str, name: str) -> list[str]:
    row = next(line for line in text.splitlines() if line.startswith(f"| {name} "))
    return [c.strip() for c in row.strip("|").split("|")]


def test_bench_table_shows_usd_per_item_and_its_share_of_the_baseline() -> None:
    results = [
        Result("baseline (window 1)", 1, 1, 4, 100, 10.0, 10.0, cost_per_item_usd=84e-6),
        Result("window 50", 50, 1, 4, 100, 1.0, 100.0, cost_per_item_usd=20e-6),
    ]
    text = markdown(results, Endpoint(), "stream bench")
    header = _row(text, "run")
    window = dict(zip(header, _row(text, "window 50"), strict=True))
    assert window["USD/item"] == "2.00e-05"
    assert window["cost vs baseline"] == "1/4.2"
    assert (
        dict(zip(header, _row(text, "baseline (window 1)"), strict=True))["cost vs baseline"]
        == "1.0x"
    )


def test_reasoning_tokens_are_priced_as_output_and_counted_apart() -> None:
    metrics = Metrics(_PRICES)
    # 300 completion tokens of which 200 were hidden reasoning (OpenAI's usage).
    metrics.observe_tokens(1000, 300, 0, answered=1, reasoning=200)
    text = metrics.render().decode()
    assert "instanced_stream_reasoning_tokens_total 200.0" in text
    line = next(
        x for x in text.splitlines() if x.startswith("instanced_stream_llm_cost_usd_total ")
    )
    assert float(line.split()[1]) == pytest.approx((1000 * 0.15 + 300 * 0.60) / 1e6)


def test_bench_prints_every_rules_bill_against_the_baseline_of_the_same_spec() -> None:
    base = Result("baseline (window 1)", 1, 1, 4, 100, 10.0, 10.0)
    base.cost_by_rule = {"openai-0.1x": 90e-6, "anthropic": 80e-6}
    window = Result("window 50", 50, 1, 4, 100, 1.0, 100.0)
    window.cost_by_rule = {"openai-0.1x": 30e-6, "anthropic": 20e-6}
    advised_base = Result("baseline (window 1), advisors", 1, 1, 4, 100, 10.0, 10.0)
    advised_base.cost_by_rule = {"openai-0.1x": 200e-6, "anthropic": 100e-6}
    advised = Result("window 50, advisors", 50, 1, 4, 100, 1.0, 100.0)
    advised.cost_by_rule = {"openai-0.1x": 40e-6, "anthropic": 50e-6}
    text = markdown([base, window, advised_base, advised], Endpoint(), "stream bench")
    text = text[text.index("under each provider's cache rule") :]  # the rules' table
    header = _row(text, "run")
    assert header[-2:] == ["openai-0.1x", "anthropic"]
    row = dict(zip(header, _row(text, "window 50"), strict=False))
    assert row["openai-0.1x"] == "3.00e-05 (1/3.0)" and row["anthropic"] == "2.00e-05 (1/4.0)"
    # the advisors' window against the advisors' baseline, not the plain one
    row = dict(zip(header, _row(text, "window 50, advisors"), strict=False))
    assert row["openai-0.1x"] == "4.00e-05 (1/5.0)" and row["anthropic"] == "5.00e-05 (1/2.0)"
    assert _row(text, "baseline (window 1), advisors")[1] == "2.00e-04 (1.0x)"


def test_eval_bills_its_requests_under_every_rule_from_their_shared_prefix() -> None:
    from instanced_stream_bench.harness.eval import SizeReport
    from instanced_stream_bench.harness.eval import markdown as eval_markdown

    one, fifty = SizeReport(1, 100), SizeReport(50, 100)
    one.cost_by_rule, fifty.cost_by_rule = {"openai-0.1x": 1e-3}, {"openai-0.1x": 2.5e-4}
    text = eval_markdown([one, fifty], "eval.jsonl", "m")
    assert "| 50 | 2.50e-06 (1/4.0) |" in text


def test_eval_shows_what_each_advisor_writes_per_item_and_costs() -> None:
    from instanced_stream_bench.harness.eval import SizeReport
    from instanced_stream_bench.harness.eval import markdown as eval_markdown

    one, fifty = SizeReport(1, 100), SizeReport(50, 100)
    one.answer_parts = {"safetyOfficer": 4000.0, "communityManager": 3000.0}
    fifty.answer_parts = {"safetyOfficer": 4000.0, "communityManager": 100.0}
    text = eval_markdown([one, fifty], "eval.jsonl", "m", price=0.60)
    assert "| window | safetyOfficer | communityManager |" in text
    assert "| 50 | 40.0 (2.40e-05) | 1.0 (6.00e-07) |" in text


def test_bench_shows_what_each_advisor_writes_per_item() -> None:
    advised = Result("window 50, advisors", 50, 1, 4, 100, 1.0, 100.0)
    advised.answer_parts = {"safetyOfficer": 40.9, "communityManager": 1.1, "calls": 18.0}
    plain = Result("window 50", 50, 1, 4, 100, 1.0, 100.0)
    plain.answer_parts = {"calls": 18.0}
    text = markdown([plain, advised], Endpoint(), "stream bench")
    assert "- window 50, advisors: safetyOfficer 40.9, communityManager 1.1, calls 18.0" in text
    assert "- window 50: calls" not in text  # no advisors, nothing to split
