"""`stream bench` in miniature: the same code path as the README's figures, on few items."""

from __future__ import annotations

import pytest
from instanced_stream.core.cache_rule import PRESETS
from instanced_stream_bench.harness.bench import run_bench
from instanced_stream_bench.harness.report import Endpoint

pytestmark = [pytest.mark.integration, pytest.mark.timeout(400)]


async def test_windows_cut_requests_and_tokens_per_item_against_the_baseline(
    bootstrap: str,
) -> None:
    results = await run_bench(
        bootstrap,
        items=400,
        partitions=2,
        windows=(20,),
        endpoint=Endpoint(latency_ms=150, per_output_token_ms=0.5, concurrency=4),
        cap_s=20,
        paced_s=2,
        variants=("reasoning=off",),
        machine_items=600,
        machine_rounds=2,
    )
    by = {r.name: r for r in results}
    # Each mode's instant runs leave one row, the median (the lower of two).
    instant = [r for r in results if r.name.startswith("instant")]
    assert len(instant) == 2
    assert all(any("median of 2 runs" in n for n in r.notes) for r in instant)
    passthrough, base, win = by["aiokafka passthrough"], by["baseline (window 1)"], by["window 20"]
    # The machine's rows take their own count of records (20,000 by default).
    assert passthrough.items == 600 and passthrough.items_per_s > 0
    assert by["instant simulator, window 50"].items == 600
    assert win.items == 400 and not win.capped
    assert base.requests_per_item is not None and win.requests_per_item is not None
    assert base.requests_per_item >= 1.0  # one call per item, refusals on top
    assert win.requests_per_item <= 1.25 / 20  # retries included
    assert base.prompt_per_item and win.prompt_per_item
    assert win.prompt_per_item < base.prompt_per_item / 4
    assert win.items_per_s > 2 * base.items_per_s
    assert win.p50_ms is not None and win.p99_ms is not None and win.p50_ms <= win.p99_ms
    assert win.ceiling_per_s is not None and win.ceiling_per_s > 0
    assert base.rss_start_mb and base.rss_end_mb
    # The processor's own CPU per item: what a window saves besides requests.
    assert base.cpu_ms_per_item and win.cpu_ms_per_item
    assert win.cpu_ms_per_item < base.cpu_ms_per_item
    # Dollars, cached prompt tokens at their price: the answer's diet makes the window cheap.
    assert base.cost_per_item_usd and win.cost_per_item_usd
    assert win.cost_per_item_usd < base.cost_per_item_usd / 3
    # The same tokens billed under every provider's rule. The example's shared prefix is
    # under every 1,024-token minimum: the baseline pays it whole whatever the rule, as
    # without a cache, where the old any-repeat rule credited it with one.
    rules = base.cost_by_rule
    assert set(rules) == set(PRESETS)
    assert rules["openai-0.1x"] == pytest.approx(rules["no-cache"])
    assert rules["anthropic"] == pytest.approx(rules["no-cache"])
    assert rules["any-repeat-0.5x"] < 0.8 * rules["no-cache"]
    # Over the minimum, the cache pays the baseline most at 0.1x, a window little.
    grown, grown_win = (
        by["baseline (window 1), prefix over 1,024"],
        by["window 20, prefix over 1,024"],
    )
    paid = grown.cost_by_rule
    assert paid["openai-0.1x"] < paid["openai-0.25x"] < paid["openai-0.5x"] < paid["no-cache"]
    assert grown_win.cost_by_rule["openai-0.1x"] < paid["openai-0.1x"] / 2
    assert grown.cached_share and grown.cached_share > 0.8  # the simulator's own report
    off = by["window 20, reasoning off"]
    assert off.items == 400 and off.completion_per_item and win.completion_per_item
    assert off.completion_per_item < win.completion_per_item / 2
    # Both delivery modes have rows, and exactly once loses nothing on the way.
    alo = by["window 50, at least once"]
    alo_instant = by["instant simulator, window 50, at least once"]
    assert alo.delivery == alo_instant.delivery == "at_least_once"
    eo, eo_instant = win, by["instant simulator, window 50"]  # the default delivery
    assert eo.delivery == eo_instant.delivery == "exactly_once"
    assert alo.items == 400 and alo_instant.items == 600
    assert eo.items == 400 and not eo.capped and eo.items_per_s > 0
    assert eo_instant.items == 600 and eo_instant.items_per_s > 0
    assert eo.p50_ms is not None and eo.p99_ms is not None
