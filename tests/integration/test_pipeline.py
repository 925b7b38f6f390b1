"""The foundation, end to end against a real Kafka broker and the LLM simulator."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
import pytest
from aiokafka import TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from instanced_stream.activities.worker import Activities
from instanced_stream.core.messages import Call
from instanced_stream.core.prompt import token_for
from instanced_stream.core.spec import Tool

from tests.conftest import Deployment, demo_json, kill_with_work

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

Deploy = Callable[..., Awaitable[Deployment]]
TOKENS = {token_for(k) for k in range(200)}


def _items(n: int, tag: str, extra: dict[int, str] | None = None) -> list[dict[str, Any]]:
    extra = extra or {}
    return [
        {"_instance": f"{tag}-{i:04d}", "comment": f"Nice write-up {tag} {i}. {extra.get(i, '')}"}
        for i in range(n)
    ]


async def test_every_item_ends_published_or_dead_lettered(deploy: Deploy) -> None:
    dep = await deploy()
    items = _items(40, "ok")
    records: list[tuple[bytes | None, bytes]] = [
        (str(i["_instance"]).encode(), orjson.dumps(i)) for i in items
    ]
    records.insert(20, (b"broken-1", b"{definitely not json"))
    await dep.produce(records)
    report = await dep.settle(41)
    assert report.unaccounted == 0, report.missing
    assert report.inputs == 41
    assert report.unexpected == 0
    assert report.calls_by_tool["moderateComment"] == 40
    letters = await dep.records(dep.settings.topics.dead_letter)
    assert [(d["code"], d["scope"]) for d in letters] == [("not_json", "item")]
    assert letters[0]["source"]["key"] == "broken-1"
    assert letters[0]["raw_b64"]
    # the items around the broken record were processed
    published = await dep.records(dep.activity_topic("moderateComment"))
    ids = {r["instance"] for r in published}
    assert ids == {i["_instance"] for i in items}
    # calls carry the producer's ids, never the batch tokens
    for rec in published:
        assert rec["call"]["_instance"] == rec["instance"]
        assert rec["instance"] not in TOKENS
        assert rec["call_id"].startswith(f"{dep.settings.topics.input}/")
        assert rec["batch"]["token"] in TOKENS
    # one LLM request per window, not per item
    assert len({r["batch"]["id"] for r in published}) < 40


async def test_invented_instances_and_unknown_tools_never_reach_activity_topics(
    deploy: Deploy,
) -> None:
    dep = await deploy()
    items = _items(12, "bad", {3: "[[sim:invent]]", 7: "[[sim:unknown-tool]]"})
    await dep.produce_items(items)
    report = await dep.settle(12)
    assert report.unaccounted == 0
    for tool in ("moderateComment", "notifyAuthor"):
        for rec in await dep.records(dep.activity_topic(tool)):
            assert rec["tool"] == tool
            assert rec["instance"] not in TOKENS
            assert rec["instance"] != "bad-0007"  # its only calls named an unknown tool
    letters = await dep.records(dep.settings.topics.dead_letter)
    codes = {d["code"] for d in letters}
    assert {"unknown_instance", "unknown_tool", "unanswered"} <= codes
    unanswered = [d for d in letters if d["code"] == "unanswered"]
    assert [d["instance"] for d in unanswered] == ["bad-0007"]
    invented = [d for d in letters if d["code"] == "unknown_instance"]
    assert invented
    assert all(d.get("source") is None for d in invented)


async def test_skipped_instance_is_asked_again_then_published(deploy: Deploy) -> None:
    dep = await deploy()
    items = _items(10, "skip", {4: "[[sim:skip-once]]", 6: "[[sim:skip-always]]"})
    await dep.produce_items(items)
    report = await dep.settle(10)
    assert report.unaccounted == 0
    published = {r["instance"]: r for r in await dep.records(dep.activity_topic("moderateComment"))}
    assert published["skip-0004"]["batch"]["attempt"] >= 2
    assert published["skip-0004"]["batch"]["size"] < 10  # the re-ask carried only the missing
    assert "skip-0006" not in published
    letters = await dep.records(dep.settings.topics.dead_letter)
    assert [(d["instance"], d["code"]) for d in letters] == [("skip-0006", "unanswered")]


async def test_llm_faults_delay_but_never_dead_letter(deploy: Deploy) -> None:
    dep = await deploy()
    dep.sim.config.faults.next.extend(["429", "500", "malformed", "429"])
    dep.sim.config.faults.retry_after_s = 0.2
    await dep.produce_items(_items(30, "flaky"))
    report = await dep.settle(30)
    assert report.unaccounted == 0
    assert report.item_dead_letters == 0
    assert report.calls_by_tool["moderateComment"] == 30
    assert dep.sim.config.faults.next == []  # every injected fault was hit


async def test_fire_and_forget_calls_commit_without_waiting(deploy: Deploy) -> None:
    dep = await deploy()
    items = _items(20, "ff", {2: "you are a fucking idiot", 9: "BUY NOW cheap watches www.x.test"})
    await dep.produce_items(items)
    report = await dep.settle(20)
    assert report.unaccounted == 0
    notes = await dep.records(dep.activity_topic("notifyAuthor"))
    assert {n["instance"] for n in notes} == {"ff-0002", "ff-0009"}
    assert all("_outputPath" not in n["call"] for n in notes)
    assert report.fire_and_forget == report.calls_by_tool["moderateComment"] + len(notes)
    # nobody consumed the activity topics, yet the processor committed every input offset
    admin = AIOKafkaAdminClient(bootstrap_servers=dep.bootstrap)
    await admin.start()
    try:
        group = dep.settings.topic_prefix + dep.settings.app_id
        tps = [TopicPartition(dep.settings.topics.input, p) for p in range(dep.settings.partitions)]
        ends = {tp.partition: 0 for tp in tps}
        for part, off in dep.positions:
            ends[part] = max(ends[part], off + 1)
        committed: dict[int, int] = {}
        for _ in range(40):
            offsets = await admin.list_consumer_group_offsets(group)
            committed = {
                tp.partition: meta.offset
                for tp, meta in offsets.items()
                if tp.topic == dep.settings.topics.input
            }
            if all(committed.get(p, 0) >= e for p, e in ends.items() if e):
                break
            await asyncio.sleep(0.5)
        assert all(committed.get(p, 0) == e for p, e in ends.items() if e), (committed, ends)
    finally:
        await admin.close()


async def test_activity_handler_receives_call_tool_context(deploy: Deploy) -> None:
    dep = await deploy()
    seen: list[tuple[Any, Any, Any]] = []
    registry = Activities()

    @registry.activity("moderateComment")
    async def handler(call: Call, tool: Tool, context: list[dict[str, Any]]) -> None:
        seen.append((call, tool, context))

    stop = asyncio.Event()
    worker = asyncio.create_task(registry.run(dep.settings, dep.spec, dep.bootstrap, stop))
    try:
        await dep.produce_items(_items(5, "act"))
        await dep.settle(5)
        for _ in range(100):
            if len(seen) >= 5:
                break
            await asyncio.sleep(0.1)
    finally:
        stop.set()
        await worker
    assert len(seen) == 5
    call, tool, context = seen[0]
    assert isinstance(call, Call)
    assert call.tool == "moderateComment"
    assert call.instance.startswith("act-")
    assert call.arguments["decision"] in ("approve", "reject")
    assert isinstance(tool, Tool)
    assert tool.name == "moderateComment"
    assert tool.parameters["properties"]["decision"]["enum"] == ["approve", "reject"]
    assert context == []  # the call imported no scopes


async def test_poison_item_is_isolated_and_its_batch_mates_published(deploy: Deploy) -> None:
    dep = await deploy()
    await dep.produce_items(_items(16, "psn", {5: "[[sim:poison]]"}))
    report = await dep.settle(16)
    assert report.unaccounted == 0
    letters = await dep.records(dep.settings.topics.dead_letter)
    assert [(d["instance"], d["code"]) for d in letters if d["scope"] == "item"] == [
        ("psn-0005", "unanswered")
    ]
    assert report.calls_by_tool["moderateComment"] == 15


def test_demo_command_accounts_for_every_item(bootstrap: str) -> None:
    result = demo_json(bootstrap, "--items", "80", timeout=180)
    assert result["items"] == 80 and result["unaccounted"] == 0
    assert result["dead_letters"] == 4
    assert set(result["dead_letter_codes"]) == {
        "not_json",
        "not_object",
        "no_instance",
        "too_large",
    }
    assert 0 < result["llm_requests"] <= 80 / 25 + 4
    assert result["activity_handled"] == sum(result["calls"].values())
    assert result["prompt_tokens"] > 0 and result["completion_tokens"] > 0
    # the example's council: two advisors speak for every answered item
    assert result["advisor_opinions"] >= 2 * 76
    assert {"consults", "divergent", "reviewed"} <= set(result)


async def test_kill_9_mid_stream_loses_nothing_and_repeats_nothing(deploy: Deploy) -> None:
    """kill -9 in the default delivery (exactly once) while the processor owns partitions
    with uncommitted records and a batch at the model, after some were committed: the
    restarted process resumes from the commit, every item ends, none twice."""
    dep = await deploy()
    assert dep.settings.delivery == "exactly_once"
    dep.sim.config.latency_ms = 500  # batches stay in flight long enough to be caught
    await dep.produce_items(_items(200, "kill"))
    for _ in range(300):
        published = await dep.records(dep.activity_topic("moderateComment"))
        if len(published) >= 25:
            break
        await asyncio.sleep(0.1)
    work = await kill_with_work(dep.proc)  # SIGKILL: no commit, no flush, no goodbye
    assert work, "the processor never had uncommitted work to lose"
    print(f"killed with uncommitted records per partition {work}")
    assert 25 <= len(published) < 200
    dep.proc.start()  # the same consumer group picks up from the last commit
    report = await dep.settle_quiet(200, wait_s=120)
    assert report.unaccounted == 0, report.missing[:5]
    assert report.unexpected == 0
    # Exactly once: the aborted transaction's outputs are never read, the redo's once.
    assert report.duplicate_calls == 0 and report.outcomes_per_input_max == 1, report.summary()
    published = await dep.records(dep.activity_topic("moderateComment"))
    assert sorted(r["instance"] for r in published) == [f"kill-{i:04d}" for i in range(200)]
