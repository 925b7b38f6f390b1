"""The seeds' protocols on the real broker, one test per deviation the issue found: `on`
modes across turns, the consulted advisor's question, independent vote scores, lazy
plans' latent calls, global vs instanced input, the manager example verbatim, output
paths, scopes and the tool's `_output` schema; and `stream demo --example seeds`."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml
from instanced_stream.activities.worker import Activities
from instanced_stream.core.messages import Call
from instanced_stream.core.spec import Tool
from instanced_stream.settings import DEFAULT_SPEC, EXAMPLES
from instanced_stream_bench.harness.seeds import seed_items
from instanced_stream_bench.testing.samples import tickets

from tests.conftest import Deployment, demo_json, workflow_states
from tests.flows import until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

Deploy = Callable[..., Awaitable[Deployment]]
TICKETS = EXAMPLES / "tickets" / "agent.yaml"


def _write(tmp_path: Path, data: dict[str, Any]) -> Path:
    path = tmp_path / "agent.yaml"
    # Quoted: YAML 1.1 would read a bare `on` key as true.
    path.write_text(yaml.safe_dump(data, allow_unicode=True).replace("\n  on:", "\n  'on':"))
    return path


def _load(base: Path) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(base.read_text().replace("\n    on: ", "\n    'on': "))
    return data


def _sent_since(dep: Deployment, mark: int) -> list[list[dict[str, Any]]]:
    """The item-carrying requests the simulator got since `mark` (its `seen_total`; its
    log keeps the last 500, so a long session's log no longer grows)."""
    out = []
    recent = list(dep.sim.seen)
    for messages in recent[max(0, len(recent) - (dep.sim.seen_total - mark)) :]:
        if any(m["role"] == "user" and m["content"].startswith("[") for m in messages):
            out.append(messages)
    return out


async def test_on_modes_across_three_turns_and_results_checked_against_output(
    deploy: Deploy, tmp_path: Path
) -> None:
    spec = {
        "name": "turns",
        "instructions": "Check each order until the check succeeds.",
        "plan": {"mode": "eager", "steps": ["check the order"], "maxTurns": 3},
        "tools": [
            {
                "name": "check",
                "description": "Check the order. Awaited.",
                "paths": ["†state.fact"],
                "_output": {
                    "type": "object",
                    "properties": {"ok": {"type": "boolean"}},
                    "required": ["ok"],
                },
                "parameters": {
                    "type": "object",
                    "properties": {"reason": {"type": "string"}},
                    "required": ["reason"],
                },
            }
        ],
        "advisors": [
            {"id": "opener", "role": "sets the direction", "on": "start"},
            {"id": "monitor", "role": "watches every turn", "on": "request"},
            # Instanced: one batch-wide opinion would stop every instance of the request.
            {
                "id": "closer",
                "role": "decides whether we are done",
                "on": "finish",
                "isInstanced": True,
            },
            {"id": "legal", "role": "only when asked", "on": None},
        ],
    }
    dep = await deploy(spec_path=_write(tmp_path, spec))
    registry = Activities()

    @registry.activity("check")
    async def check(call: Call, tool: Tool, context: list[dict[str, Any]]) -> Any:
        return {"ok": "yes"}  # breaks the tool's _output: ok must be a boolean

    stop = asyncio.Event()
    worker = asyncio.create_task(registry.run(dep.settings, dep.spec, dep.bootstrap, stop))
    try:
        await dep.produce_items(
            [
                {"_instance": "o-1", "text": "Order 1 arrived late."},
                {"_instance": "o-2", "text": "Order 2 arrived late. [[sim:stop]]"},
            ]
        )

        async def both_done() -> dict[str, Any]:
            done = {d["instance"]: d for d in await dep.records(dep.settings.topics.done)}
            return done if len(done) == 2 else {}

        done = await until(both_done, 120)
    finally:
        stop.set()
        await worker
    assert done["o-1"]["status"] == "turn_limit" and done["o-1"]["turns"] == 3
    # The finish advisor is heard every turn (one request holds the answer and its
    # opinion) and consulted where the loop decides (core/finish.py): o-2's stop on turn
    # 1, with turns to spare and a call proposed, changes nothing; on turn 2, the one
    # before the last, it ends the workflow, and that answer's call is not run.
    assert done["o-2"]["status"] == "stopped" and done["o-2"]["turns"] == 2
    spoke: dict[tuple[str, int], set[str]] = {}
    for rec in await dep.records(dep.settings.topics.advice):
        spoke[(rec["instance"], rec["turn"])] = {o["advisor"] for o in rec["opinions"]}
    assert spoke == {
        ("o-1", 1): {"opener", "monitor", "closer"},
        ("o-1", 2): {"monitor", "closer"},
        ("o-1", 3): {"monitor", "closer"},
        ("o-2", 1): {"opener", "monitor", "closer"},
        ("o-2", 2): {"monitor", "closer"},
    }
    letters = await dep.records(dep.settings.topics.dead_letter)
    (unrun,) = [d for d in letters if d["code"] == "stopped"]
    assert unrun["instance"] == "o-2" and unrun["call"]["_tool"] == "check"
    assert unrun["turn"] == 2
    checks = await dep.records(dep.activity_topic("check"))
    assert {c["turn"] for c in checks if c["instance"] == "o-2"} == {1}  # turn 2's: unrun
    # Every result broke `_output`: dead-lettered with a reason, the call's error in state.
    bad = [d for d in letters if d["code"] == "bad_result"]
    assert {d["instance"] for d in bad} == {"o-1", "o-2"} and len(bad) >= 4
    assert all(d["scope"] == "call" and "ok" in d["reason"] for d in bad)
    errors = done["o-1"]["state"]["errors"]
    assert len(errors) == 3 and all("_output" in e for e in errors.values())
    assert "fact" not in done["o-1"]["state"]


async def test_consulted_advisor_gets_the_question_and_low_scores_stay_low(
    deploy: Deploy, tmp_path: Path
) -> None:
    data = _load(DEFAULT_SPEC)
    data["advice"] = {"mode": "gate", "min_score": 0.5}
    dep = await deploy(spec_path=_write(tmp_path, data))
    mark = dep.sim.seen_total
    await dep.produce_items(
        [
            {"_instance": "q-1", "comment": "Is this fine? [[sim:consult]]"},
            {"_instance": "q-2", "comment": "Nice write-up. [[sim:low-votes]]"},
        ]
    )
    report = await dep.settle(2)
    assert report.unaccounted == 0
    controls = [
        orjson.loads(m["content"])
        for messages in _sent_since(dep, mark)
        for m in messages
        if m["role"] == "user" and m["content"].startswith('{"activeAdvisors"')
    ]
    asked = [c for c in controls if c.get("questions")]
    assert asked, controls
    assert asked[0]["questions"][0]["advisor"] == "legalCounsel"
    assert asked[0]["questions"][0]["question"]  # the model's own words, passed on
    assert "legalCounsel" in asked[0]["activeAdvisors"]
    advice = {a["instance"]: a for a in await dep.records(dep.settings.topics.advice)}
    low = advice["q-2"]
    safety = next(o for o in low["opinions"] if o["advisor"] == "safetyOfficer")
    assert safety["votes"] == {"approve": 0.1}  # a lone 10 is 10%, not certainty
    assert low["consensus"]["score"] <= 0.1 + 1e-9
    assert low["reviewed"] == low["call_ids"] and low["reviewed"]
    held = await dep.records(dep.settings.topics.review)
    assert {r["instance"] for r in held} >= {"q-2"}


async def test_lazy_plan_runs_nothing_latent_before_approval_and_never_publishes_it(
    deploy: Deploy, tmp_path: Path
) -> None:
    """Whatever the model answers, the processor proposes a graph without latent results
    (a latent result on the planning turn is refused and re-asked), and after approval
    a latent step waits for the state it reads; latent calls are never published."""
    data = yaml.safe_load(TICKETS.read_text())
    data["plan"] = {"mode": "lazy", "steps": ["look up", "route"], "maxTurns": 4}
    path = _write(tmp_path, data)
    dep = await deploy(spec_path=path, STREAM_DELIVERY="exactly_once")
    await dep.produce_items(tickets(2))
    report = await dep.settle(2)
    assert report.unaccounted == 0 and report.proposals == 2
    proposals = await dep.records(dep.settings.topics.proposals)
    for p in proposals:
        latent = [c for c in p["calls"] if c["_tool"] in ("summarize", "think")]
        assert all(set(c) <= {"_tool", "_instance", "_outputPath", "_scopes",
                              "_reasoningForCall"} for c in latent)  # fmt: skip
    states = await until(lambda: workflow_states(dep))
    assert all("summary" not in s["state"] for s in states.values())
    done = await dep.cli("approve", "--batch", proposals[0]["batch"]["id"], STREAM_SPEC=str(path))
    assert done.returncode == 0, done.stderr
    approved = {p["instance"] for p in proposals if p["batch"]["id"] == proposals[0]["batch"]["id"]}

    async def started() -> dict[str, dict[str, Any]]:
        got = await workflow_states(dep)
        ok = all(got[i]["pending"] for i in approved)
        return got if ok else {}

    states = await until(started)
    for inst in approved:
        st = states[inst]
        # No result came back (no worker here): what reads those results waits.
        assert "summary" not in st["state"]
        pending = {p["tool"] for p in st["pending"].values()}
        assert pending <= {"lookupCustomer", "assessUrgency"} and pending
    looked_up = await until(lambda: dep.records(dep.activity_topic("lookupCustomer")))
    assert {r["instance"] for r in looked_up} <= approved


async def test_instance_input_overrides_the_global_input(deploy: Deploy, tmp_path: Path) -> None:
    data = yaml.safe_load(TICKETS.read_text())
    data["inputs"] = [{"type": "input", "language": "en", "region": "eu"}]
    dep = await deploy(spec_path=_write(tmp_path, data))
    items = tickets(2)
    items[0]["language"] = "fr"
    await dep.produce_items(items)
    assert (await dep.settle(2)).unaccounted == 0
    looked = await until(lambda: dep.records(dep.activity_topic("lookupCustomer")))
    seen = {r["instance"]: r["context"] for r in looked}
    [own] = seen[items[0]["_instance"]]
    assert own["language"] == "fr" and own["region"] == "eu"  # targeted wins, global fills
    [other] = seen[items[1]["_instance"]]
    assert other["language"] == "en" and other["region"] == "eu"


async def test_manager_seed_verbatim_routes_by_shown_id_and_leaves_a_untouched(
    deploy: Deploy,
) -> None:
    dep = await deploy(
        spec_path=EXAMPLES / "seeds" / "manager.yaml", STREAM_DELIVERY="exactly_once"
    )
    mark = dep.sim.seen_total
    employees = seed_items("manager")
    assert all(set(e) == {"type", "_instance", "task", "status"} for e in employees)
    await dep.produce_items(employees)
    report = await dep.settle(2)
    assert report.unaccounted == 0 and report.item_dead_letters == 0
    assert not await dep.records(dep.settings.topics.dead_letter)
    # Each employee shown once: no re-ask for the silent employee_A. Usually one request;
    # two when the window closed between the two partitions' fetches (B then asked
    # alone, as ①).
    shown: list[tuple[str, Any]] = []
    for sent in _sent_since(dep, mark):
        body = orjson.loads(next(m["content"] for m in sent if m["content"].startswith("[")))
        shown += [(m["_id"], m["_instance"]) for m in body]
    assert sorted(employee for employee, _ in shown) == ["employee_A", "employee_B"], shown
    # Calls name batch tokens (numbers in the compact form); ids are only to read.
    assert {token for _, token in shown} <= {"①", "②", 1, 2}
    # Whatever the model answered: each employee has one outcome, and a latent
    # updateTask's output is on it (no plan: one-shot, nothing kept in state): an answer
    # of only the update is a state update record, a NoAction (or silence) a no-action.
    no_action = await dep.records(dep.settings.topics.no_action)
    updated = await dep.records(dep.settings.topics.state_updates)
    outcomes = {n["instance"]: n.get("latent", []) for n in no_action}
    outcomes |= {u["instance"]: u["updates"] for u in updated}
    assert len(no_action) + len(updated) == 2
    assert set(outcomes) == {"employee_A", "employee_B"}
    for latent in outcomes.values():
        for call in latent:
            assert call["_tool"] == "updateTask" and {"newTask", "newStatus"} <= set(call)
            # The seed spells the output path "output": read as one, never an argument.
            assert call["_outputPath"] == "†state" and "output" not in call
    assert all(n["reason"] for n in no_action)
    assert await workflow_states(dep) == {}


async def test_bad_output_paths_and_scopes_are_refused_and_a_latent_branch_collapses(
    deploy: Deploy, tmp_path: Path
) -> None:
    data = yaml.safe_load(TICKETS.read_text())
    summarize = next(t for t in data["tools"] if t["name"] == "summarize")
    summarize["paths"] = ["†state.summary", "†state.notes"]
    dep = await deploy(spec_path=_write(tmp_path, data))
    items = tickets(4)
    items[0]["body"] += " [[sim:bad-path]]"
    items[1]["body"] += " [[sim:bad-scope]]"
    items[2]["body"] += " [[sim:latent-branch]]"
    await dep.produce_items(items)
    report = await dep.settle(4)
    assert report.unaccounted == 0
    letters = await dep.records(dep.settings.topics.dead_letter)
    codes = {(d["code"], d["instance"]) for d in letters}
    assert ("bad_output_path", items[0]["_instance"]) in codes
    assert ("bad_scopes", items[1]["_instance"]) in codes
    # Eager: a latent call's branch collapses to the first path the model wrote (the
    # seeds' update), not refused: no dead letter, its summary written there.
    assert not [d for d in letters if d["instance"] == items[2]["_instance"]]
    changelog = await workflow_states(dep)
    st = changelog[items[2]["_instance"]]
    assert "summary" in st["state"] and "notes" not in st["state"]
    summary = next(s for s in st["plan"] if s["tool"] == "summarize")
    assert (summary["status"], summary["wrote"]) == ("done", "†state.summary")
    assert not any(d["code"] == "internal_error" for d in letters)  # batch-mates unharmed
    assert report.dead_letters.get("internal_error", 0) == 0
    published = await dep.records(dep.activity_topic("assessUrgency"))
    assert {r["instance"] for r in published} == {i["_instance"] for i in items}
    assert dep.proc.proc is not None and dep.proc.proc.poll() is None  # no crash loop


def test_demo_runs_the_seeds_examples(bootstrap: str) -> None:
    result = demo_json(bootstrap, "--example", "seeds", timeout=230)
    moderation, manager = result["examples"]["moderation"], result["examples"]["manager"]
    assert moderation["items"] == 100 and moderation["llm_requests"] == 1
    assert moderation["batch_sizes"] == [[100, 100]]
    # The simulator answers the seed's answer verbatim (json_object: "output": "†state",
    # "_instance": "employee_B"): B's new task is on its outcome, A is untouched.
    assert manager["updated"] == {
        "employee_B": [{"newTask": "Finalize the quarterly report", "newStatus": "High Priority"}]
    }
    assert manager["untouched"] == 1 and manager["dead_letters"] == 0
    # B's update is published as a state update; A's silence is its explicit no-action.
    assert manager["state_updated"] == ["employee_B"]
    assert set(manager["no_action_reasons"]) == {"employee_A"}
    advisors = result["examples"]["advisors"]
    assert {o["advisor"] for o in advisors["opinions"]} == {"аналитикРисков"}
    # The seed's scores travel unscaled (the simulator answers as the seed does).
    assert advisors["opinions"][0]["votes"] == {"deploy": 0.1, "rollback": 0.05, "delay": 0.95}
    assert advisors["calls"] == {"delay": 1}
    # The lazy example (#26): each plan proposed once, approved once, then executed;
    # nothing latent answered before approval.
    lazy = result["examples"]["lazy"]
    plans = lazy["plans"]
    assert plans["proposed"] == plans["approved"] == lazy["items"]
    assert plans["executed_calls"] >= lazy["items"] and plans["latent_before_approval"] == 0
    assert plans["done"] == {"done": lazy["items"]} and plans["ended"] == lazy["items"]
    assert result["unaccounted"] == 0
