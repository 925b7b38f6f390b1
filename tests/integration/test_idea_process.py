"""The Idea Process of the tickets example on a real broker: each partition's unit writes
its share of the plan's graph and counts with the commits that change them; `stream
process-idea` sums the shares; its counts agree with what else the run left (the calls on
the activity topics, `stream audit`'s workflows, the done records); one instance's
standing is read by `--instance`; and the processor's live page draws the graph with the
same counts in a real browser (chromium)."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from instanced_stream.activities.worker import load_activities
from instanced_stream.ops.idea_process import read_ideas
from instanced_stream.settings import EXAMPLES
from instanced_stream_bench.testing.samples import tickets

from tests.conftest import Deployment

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

Deploy = Callable[..., Awaitable[Deployment]]
TICKETS = EXAMPLES / "tickets"
ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"
ACTIVITIES = ["lookupCustomer", "assessUrgency", "routeTicket", "pageOnCall"]


async def _cli(dep: Deployment, *args: str) -> subprocess.CompletedProcess[str]:
    return await dep.cli(
        *args, STREAM_SPEC=str(TICKETS / "agent.yaml"), STREAM_APP_ID=dep.settings.app_id
    )


async def _idea(
    dep: Deployment, until: Callable[[dict[str, Any]], bool], wait_s: float
) -> dict[str, Any]:
    """`stream process-idea --json`'s plan, once `until` holds of it."""
    deadline = time.monotonic() + wait_s
    while True:
        shown = await _cli(dep, "process-idea", "--json")
        assert shown.returncode == 0, shown.stderr
        plans = orjson.loads(shown.stdout)
        if plans and until(plans[0]):
            assert len(plans) == 1  # one plan edition ran
            return dict(plans[0])
        assert time.monotonic() < deadline, f"the Idea Process never got there: {plans}"
        await asyncio.sleep(1.0)


def _by_tool(idea: dict[str, Any]) -> dict[str, Counter[str]]:
    out: dict[str, Counter[str]] = {}
    for node in idea["nodes"]:
        out.setdefault(node["tool"], Counter()).update(node["counts"])
    return out


async def _live_page(dep: Deployment, shot: Path) -> list[dict[str, Any]]:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium, "the live-page test needs Debian's chromium (./dev test installs it)"
    from playwright.async_api import async_playwright

    async with async_playwright() as pw:
        browser = await pw.chromium.launch(
            executable_path=chromium, args=["--no-sandbox", "--disable-gpu", "--no-first-run"]
        )
        try:
            page = await browser.new_page(viewport={"width": 1300, "height": 1100})
            await page.goto(f"{dep.web}/")
            await page.wait_for_selector("#ideas g.node", timeout=30_000)
            drawn = await page.eval_on_selector_all(
                "#ideas g.node",
                "gs => gs.map(g => ({node: g.dataset.node, counts: JSON.parse(g.dataset.counts),"
                " text: g.textContent}))",
            )
            edges = await page.locator("#ideas svg path:not(marker path)").count()
            await page.locator("#ideas").scroll_into_view_if_needed()
            await page.screenshot(path=str(shot), full_page=True)
        finally:
            await browser.close()
    assert edges > 0  # the graph's edges are drawn (page reads what assess writes)
    return list(drawn)


async def test_the_tickets_idea_process_counts_what_the_run_did(deploy: Deploy) -> None:
    dep = await deploy(spec_path=TICKETS / "agent.yaml")
    made = tickets(8)
    await dep.produce_items(made)
    # no worker yet: every instance's awaited calls are out, and wait for their results
    before = await _idea(
        dep, lambda i: _by_tool(i).get("lookupCustomer", Counter())["running"] == 8, 90
    )
    assert before["instances"] == 8 and before["by_status"] == {"pending": 8}
    assert _by_tool(before)["lookupCustomer"]["done"] == 0  # nothing answered them yet

    registry = load_activities(str(TICKETS / "activities.py"))
    stop = asyncio.Event()
    worker = asyncio.create_task(registry.run(dep.settings, dep.spec, dep.bootstrap, stop))
    try:
        after = await _idea(dep, lambda i: i["by_status"].get("done") == 8, 150)
        shot = Path(os.environ.get("STREAM_SHOT_DIR", str(ARTIFACTS))) / "idea-process.png"
        shot.parent.mkdir(parents=True, exist_ok=True)
        drawn = await _live_page(dep, shot)
    finally:
        stop.set()
        await worker
    counts = _by_tool(after)
    # The counts against what else the run left: each published call is a step that ran.
    for tool in ACTIVITIES:
        published = len(await dep.records(dep.activity_topic(tool)))
        ran = counts.get(tool, Counter())
        assert ran["done"] + ran["failed"] == published, (tool, ran, published)
        assert ran["waiting"] == ran["running"] == 0
    assert counts["lookupCustomer"]["done"] == 8
    audit = await _cli(dep, "audit", "--json")
    report = orjson.loads(audit.stdout)
    flows = report["workflows"]
    assert after["instances"] == flows["started"] == 8
    assert (
        after["by_status"]["done"]
        == flows["done"]
        == len(await dep.records(dep.settings.topics.done))
    )
    # a routine ticket's page is skipped on the branch not taken, counted by both
    assert counts["pageOnCall"]["skipped"] == flows["plan_counts"].get("skipped_branch", 0)
    assert sum(counts["routeTicket"].values()) == report["calls_by_tool"]["routeTicket"]
    print("idea process:", orjson.dumps(after["nodes"]).decode())
    print(
        "audit:",
        orjson.dumps({"calls_by_tool": report["calls_by_tool"], "workflows": flows}).decode(),
    )

    # the live page's picture: every node of the topic's sum, with its counts
    assert {d["node"]: d["counts"] for d in drawn} == {n["id"]: n["counts"] for n in after["nodes"]}
    assert all(f"done {d['counts']['done']}" in d["text"] for d in drawn)
    assert shot.stat().st_size > 10_000
    async with aiohttp.ClientSession() as session, session.get(f"{dep.web}/api/ideas") as resp:
        served = await resp.json()
    assert "t-000001" not in orjson.dumps(served).decode()  # counts only: no instance named

    # where one instance stands: its own plan, from the state changelog
    one = await _cli(dep, "process-idea", "--instance", made[0]["_instance"])
    assert one.returncode == 0, one.stderr
    standing = orjson.loads(one.stdout)
    assert standing["status"] == "done"
    assert {s["tool"] for s in standing["plan"]} >= {"lookupCustomer", "assessUrgency"}
    missing = await _cli(dep, "process-idea", "--instance", "no-such-ticket")
    assert missing.returncode == 1


async def test_a_restarted_processor_counts_the_same(deploy: Deploy) -> None:
    """A new owner restores the partitions' tallies from the changelog: after a restart
    and one more ticket, the sum is the first run's plus that ticket, not twice it."""
    dep = await deploy(spec_path=TICKETS / "agent.yaml")
    await dep.produce_items(tickets(4))
    first = await _idea(dep, lambda i: i["instances"] == 4 and "pending" in i["by_status"], 90)
    await asyncio.to_thread(dep.proc.stop)
    dep.proc.start()
    extra = {**tickets(5)[4], "_instance": "t-extra"}
    await dep.produce_items([extra])
    again = await _idea(dep, lambda i: i["instances"] == 5, 120)
    assert again["by_status"] == {"pending": 5}
    lookups = _by_tool(again)["lookupCustomer"]
    assert lookups["running"] == _by_tool(first)["lookupCustomer"]["running"] + 1 == 5
    shares = await read_ideas(dep.bootstrap, dep.settings)
    assert [s.instances for s in shares] == [5]
