"""What ops see: the metrics endpoint, the probes, and the live page in a real browser."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from tests.conftest import Deployment

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

Deploy = Callable[..., Awaitable[Deployment]]
ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "moderation" / "activities.py"
METRICS = [
    "instanced_stream_items_in_total",
    'instanced_stream_calls_out_total{tool="moderateComment"}',
    'instanced_stream_dead_letters_total{code="not_json"}',
    "instanced_stream_batch_size_bucket",
    "instanced_stream_window_close_total",
    "instanced_stream_llm_latency_seconds_bucket",
    "instanced_stream_llm_in_flight",
    'instanced_stream_tokens_total{kind="input"}',
    'instanced_stream_tokens_total{kind="cached_input"}',
    'instanced_stream_tokens_total{kind="output"}',
    "instanced_stream_rebalances_total",
    "instanced_stream_build_info{",
    "instanced_stream_cost_per_item_usd",
    "instanced_stream_llm_retries_total",
    "instanced_stream_circuit_open",
    "instanced_stream_consumer_lag{",
]


async def _get(url: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as session, session.get(url) as resp:
        return resp.status, await resp.text()


def _value(text: str, prefix: str) -> float:
    line = next(line for line in text.splitlines() if line.startswith(prefix))
    return float(line.rsplit(" ", 1)[1])


async def _run(dep: Deployment) -> None:
    items = [{"_instance": f"m-{i:03d}", "comment": f"helpful note {i}"} for i in range(30)]
    records: list[tuple[bytes | None, bytes]] = [
        (str(i["_instance"]).encode(), orjson.dumps(i)) for i in items
    ]
    records.append((b"m-bad", b"{not json"))
    await dep.produce(records)
    report = await dep.settle(31)
    assert report.unaccounted == 0


async def test_metrics_and_probes_after_a_run(deploy: Deploy) -> None:
    dep = await deploy(STREAM_LOG_FORMAT="json")
    dep.sim.config.faults.next.append("429")
    dep.sim.config.faults.retry_after_s = 0.1
    await _run(dep)
    text = ""
    for _ in range(40):  # the lag gauge is refreshed every few seconds
        status, text = await _get(f"{dep.web}/metrics")
        if status == 200 and all(m in text for m in METRICS):
            break
        await asyncio.sleep(0.5)
    missing = [m for m in METRICS if m not in text]
    assert not missing, missing
    assert _value(text, "instanced_stream_items_in_total") == 31
    assert _value(text, 'instanced_stream_calls_out_total{tool="moderateComment"}') == 30
    assert _value(text, 'instanced_stream_dead_letters_total{code="not_json"}') == 1
    assert _value(text, "instanced_stream_llm_retries_total") >= 1
    assert _value(text, "instanced_stream_circuit_open") == 0
    assert (await _get(f"{dep.web}/healthz"))[0] == 200
    assert (await _get(f"{dep.web}/readyz"))[0] == 200
    logged = [
        orjson.loads(line) for line in dep.proc.tail(2000).splitlines() if line.startswith("{")
    ]
    letter = next(e for e in logged if e.get("code") == "not_json")
    assert letter["level"] == "WARNING" and letter["logger"] == "stream.processor"
    assert {"topic", "partition", "offset"} <= set(letter)


async def test_live_page_in_chromium_matches_the_metrics(deploy: Deploy) -> None:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium, "the live-page test needs Debian's chromium (./dev test installs it)"
    from playwright.async_api import async_playwright

    dep = await deploy()
    await _run(dep)
    live: dict[str, Any] = orjson.loads((await _get(f"{dep.web}/api/live"))[1])
    ARTIFACTS.mkdir(exist_ok=True)
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(
            executable_path=chromium,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
            ],
        )
        try:
            page = await browser.new_page(viewport={"width": 1200, "height": 900})
            await page.goto(f"{dep.web}/")
            await page.wait_for_function("document.getElementById('items_in').textContent !== '–'")
            shown = await page.text_content("#items_in")
            calls = await page.text_content("#calls_out")
            rows = await page.locator("#decisions tr").count()
            divergent = await page.locator("#decisions tr.divergent").count()
            # the charts of the last minutes: each gains a point per poll, and the rate
            # chart rises while more items flow (the page polls; nothing else feeds it)
            charts = page.locator("#history .chart")
            first = await _chart_points(charts)
            await dep.produce_items(
                [{"_instance": f"m-more-{i}", "comment": f"another note {i}"} for i in range(9)]
            )
            await dep.settle(40)
            more = dict(first)
            for _ in range(100):
                more = await _chart_points(charts)
                if all(more[k] >= first[k] + 3 for k in first):
                    break
                await asyncio.sleep(0.1)
            drawn = await page.eval_on_selector_all(
                "#history polyline", "ls => ls.map(l => l.getAttribute('points').split(' ').length)"
            )
            rate_peak = await page.get_attribute("#history [data-series=items_per_s]", "data-max")
            # the chart's latest point and the tile, read together (one poll's figures)
            cost_last, cost_tile = await page.evaluate(
                "[document.querySelector('#history [data-series=cost_per_item_usd]')"
                ".dataset.last, document.getElementById('cost_per_item_usd').textContent]"
            )
            await page.screenshot(path=str(ARTIFACTS / "live-page.png"), full_page=True)
        finally:
            await browser.close()
    assert shown == str(live["items_in"]) == "31"
    assert calls == str(live["calls_out"])
    assert rows == len(live["decisions"]) > 0
    assert divergent == sum(1 for d in live["decisions"] if d["divergent"])
    assert (ARTIFACTS / "live-page.png").stat().st_size > 10_000
    assert set(first) == {"items_per_s", "llm_latency_p99_s", "cost_per_item_usd", "lag"}
    assert all(more[k] >= first[k] + 3 for k in first), (first, more)
    assert len(set(drawn)) == 1 and drawn[0] >= max(more.values()) - 1, drawn  # a vertex a point
    assert rate_peak is not None and float(rate_peak) > 0  # the nine more items were seen
    assert float(cost_last) == float(cost_tile) > 0
    assert "lag" in live and live["lag"] >= 0


async def _chart_points(charts: Any) -> dict[str, int]:
    """Each chart of the live page's last minutes: how many points it holds now."""
    found: dict[str, int] = {}
    for k in range(await charts.count()):
        chart = charts.nth(k)
        series = await chart.get_attribute("data-series")
        found[str(series)] = int(await chart.get_attribute("data-points") or 0)
    return found


async def test_activity_worker_serves_its_metrics(deploy: Deploy) -> None:
    from instanced_stream.activities.worker import load_activities

    from tests.conftest import _free_port

    dep = await deploy()
    port = _free_port()
    settings = dep.settings.model_copy(update={"worker_web_port": port, "web_host": "127.0.0.1"})
    registry = load_activities(str(EXAMPLE))
    stop = asyncio.Event()
    task = asyncio.create_task(registry.run(settings, dep.spec, dep.bootstrap, stop, serve=True))
    try:
        await _run(dep)
        text = ""
        for _ in range(60):
            with contextlib.suppress(aiohttp.ClientError):  # not listening yet
                text = (await _get(f"http://127.0.0.1:{port}/metrics"))[1]
            if 'instanced_stream_activity_handled_total{tool="moderateComment"} 30' in text:
                break
            await asyncio.sleep(0.5)
        assert 'instanced_stream_activity_handled_total{tool="moderateComment"} 30.0' in text
        assert "instanced_stream_activity_seconds_bucket" in text
        assert (await _get(f"http://127.0.0.1:{port}/healthz"))[0] == 200
    finally:
        stop.set()
        await task
