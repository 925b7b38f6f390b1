"""The Advisor protocol through the real pipeline: broker, processor process, simulator."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml
from instanced_stream.settings import DEFAULT_SPEC

from tests.conftest import Deployment

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

Deploy = Callable[..., Awaitable[Deployment]]


def _spec(tmp_path: Path, **changes: Any) -> str:
    """The example spec with changes, written to a file the processor is started with."""
    data = yaml.safe_load(DEFAULT_SPEC.read_text().replace("\n    on: ", "\n    'on': "))
    extra = changes.pop("extra_advisors", [])
    data["advisors"] += extra
    data.update(changes)
    path = tmp_path / "agent.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def _items(n: int, tag: str, extra: dict[int, str] | None = None) -> list[dict[str, Any]]:
    extra = extra or {}
    return [
        {"_instance": f"{tag}-{i:03d}", "comment": f"Thanks for the notes {i}. {extra.get(i, '')}"}
        for i in range(n)
    ]


async def test_on_modes_instanced_and_batch_opinions_one_record_per_instance(
    deploy: Deploy, tmp_path: Path
) -> None:
    closer = {
        "id": "closer",
        "role": "Decide whether we are done.",
        "on": "finish",
        "schema": {
            "type": "object",
            "properties": {"done": {"type": "boolean"}},
            "required": ["done"],
        },
    }
    dep = await deploy(STREAM_SPEC=_spec(tmp_path, extra_advisors=[closer]))
    await dep.produce_items(_items(12, "on"))
    report = await dep.settle(12)
    assert report.unaccounted == 0
    advice = await dep.records(dep.settings.topics.advice)
    assert sorted(a["instance"] for a in advice) == [f"on-{i:03d}" for i in range(12)]
    assert all(a["turn"] == 1 for a in advice)
    for record in advice:
        by_advisor = {o["advisor"]: o for o in record["opinions"]}
        # single turn: start, request and finish advisors speak; on-demand stays silent
        assert set(by_advisor) == {"safetyOfficer", "communityManager", "closer"}
        assert by_advisor["safetyOfficer"]["instanced"] is True
        assert by_advisor["communityManager"]["instanced"] is False
        assert by_advisor["safetyOfficer"]["fields"]["thought"]
        assert record["consensus"]["option"] in ("approve", "reject")
    batches: dict[str, set[str]] = {}
    for record in advice:
        tone = next(o for o in record["opinions"] if o["advisor"] == "communityManager")
        batches.setdefault(record["batch"]["id"], set()).add(tone["fields"]["tone"])
    assert all(len(tones) == 1 for tones in batches.values())  # one opinion per batch
    calls = await dep.records(dep.activity_topic("moderateComment"))
    assert all(c["advice"]["option"] in ("approve", "reject") for c in calls)
    assert {c["call_id"] for c in calls} == {cid for a in advice for cid in a["call_ids"]}


async def test_consult_round_trip_and_malformed_votes(deploy: Deploy) -> None:
    dep = await deploy()
    items = _items(10, "cs", {2: "[[sim:consult]]", 6: "[[sim:bad-votes]]"})
    await dep.produce_items(items)
    report = await dep.settle(10)
    assert report.unaccounted == 0
    assert report.calls_by_tool["moderateComment"] == 10
    advice = {a["instance"]: a for a in await dep.records(dep.settings.topics.advice)}
    consulted = advice["cs-002"]
    assert consulted["consulted"] == ["legalCounsel"]
    legal = next(o for o in consulted["opinions"] if o["advisor"] == "legalCounsel")
    assert legal["fields"]["exposure"] in ("low", "medium", "high")
    assert all(not a["consulted"] for k, a in advice.items() if k != "cs-002")
    calls = {c["instance"]: c for c in await dep.records(dep.activity_topic("moderateComment"))}
    assert calls["cs-002"]["batch"]["size"] == 1  # decided in the follow-up generation
    assert calls["cs-002"]["advice"]["consulted"] == ["legalCounsel"]
    broken = [o for o in advice["cs-006"]["opinions"] if o.get("error")]
    assert broken and all("not JSON" in o["error"] and o.get("votes") is None for o in broken)
    assert "cs-006" in calls  # a bad ballot is recorded, never fatal
    done = await dep.cli("advice", "--last", "50")
    assert done.returncode == 0, done.stderr
    shown = done.stdout
    assert "cs-002" in shown and "consulted legalCounsel" in shown
    assert "unusable votes: votes are not JSON" in shown


async def test_weighted_consensus_and_gate_to_review(deploy: Deploy, tmp_path: Path) -> None:
    spec = _spec(tmp_path, advice={"mode": "gate", "min_score": 0.5, "clear_score": 0.7})
    dep = await deploy(STREAM_SPEC=spec)
    await dep.produce_items(_items(8, "gt", {3: "[[sim:disagree]]"}))
    report = await dep.settle(8)
    assert report.unaccounted == 0
    assert report.reviewed == 1
    review = await dep.records(dep.settings.topics.review)
    assert [(r["instance"], r["tool"]) for r in review] == [("gt-003", "moderateComment")]
    assert review[0]["call"]["decision"] == "approve"
    assert "against the council" in review[0]["review"]
    published = {c["instance"] for c in await dep.records(dep.activity_topic("moderateComment"))}
    assert "gt-003" not in published and len(published) == 7
    for record in await dep.records(dep.settings.topics.advice):
        usable = [o for o in record["opinions"] if o.get("votes")]
        total = sum(o["weight"] for o in usable)
        for option, share in record["consensus"]["distribution"].items():
            expected = sum(o["weight"] * o["votes"].get(option, 0) for o in usable) / total
            assert math.isclose(share, expected, abs_tol=1e-3)
        if record["instance"] == "gt-003":
            assert record["reviewed"] == record["call_ids"][:1]


async def test_advisors_from_the_context_topic_live_and_at_start(deploy: Deploy) -> None:
    dep = await deploy()
    context = dep.settings.topics.context
    guardian = {
        "type": "advisor",
        "id": "brandGuardian",
        "role": "Guard the brand voice",
        "on": "request",
        "isInstanced": True,
        "weight": 0.5,
    }
    broken = {"type": "advisor", "id": "brokenAdvisor", "role": "r", "on": "always"}
    await dep.produce_to(
        context,
        [(b"brandGuardian", orjson.dumps(guardian)), (b"brokenAdvisor", orjson.dumps(broken))],
    )

    async def speakers(tag: str) -> set[str]:
        await dep.produce_items(_items(1, tag))
        await dep.settle(len(dep.positions))
        advice = {a["instance"]: a for a in await dep.records(dep.settings.topics.advice)}
        return {o["advisor"] for o in advice[f"{tag}-000"]["opinions"]}

    heard: set[str] = set()
    for attempt in range(20):  # the running processor follows the topic live
        heard = await speakers(f"live{attempt}")
        if "brandGuardian" in heard:
            break
        await asyncio.sleep(0.5)
    assert "brandGuardian" in heard and "brokenAdvisor" not in heard
    assert "brokenAdvisor" in dep.proc.tail(400) and "refused" in dep.proc.tail(400)
    # a tombstone removes it; a restarted processor loads the topic before consuming
    await dep.produce_to(context, [(b"brandGuardian", None)])
    dep.proc.stop()
    dep.proc.start()
    assert "brandGuardian" not in await speakers("restart")
