"""`stream demo --example seeds`: the seeds' own examples, as they are written, end to end.

Three runs on one broker, each with its own processor and topics (examples/seeds/):
- moderation: the Instancing seed's 100 comments, one input message each, in ONE request;
- advisors: the Advisor seed's council (`kind: "advisor"`, the id аналитикРисков) on a
  release candidate whose state holds the deployment history its scope names;
- manager: the Instancing seed's global instruction and two employees' state messages,
  verbatim (no extra fields); employee_A is left untouched, as in the seed's answer;
- lazy: the Plan seed's lazy mode: the model writes each comment's graph (a latent
  assessment, then the moderation call that reads it), the demo approves every proposal
  as a moderator would, and the graph runs; its summary says what was proposed, approved
  and executed, and that nothing latent was answered before approval.
"""

from __future__ import annotations

import asyncio
import secrets
import sys
import time
from collections import Counter
from typing import Any

import orjson
from instanced_stream.core.messages import ApprovalRecord
from instanced_stream.core.spec import AgentSpec
from instanced_stream.kafka.topics import activity_topics, read_json
from instanced_stream.ops.approvals import pending_now
from instanced_stream.settings import EXAMPLES, Settings

from instanced_stream_bench.harness.demo import launch_processor, produce, report_when_accounted
from instanced_stream_bench.harness.target import Target, llm_target, processor_usage
from instanced_stream_bench.testing.broker import free_port, kafka_bootstrap
from instanced_stream_bench.testing.samples import comments
from instanced_stream_bench.testing.sim.server import SimConfig

__all__ = ["approve_until_ended", "run_example", "run_seeds", "seed_items"]

SEEDS = EXAMPLES / "seeds"

# The manager seed's context, verbatim: the global instruction is in manager.yaml.
_EMPLOYEES = [
    {
        "type": "state",
        "_instance": "employee_A",
        "task": "Draft initial proposal",
        "status": "In Progress",
    },
    {
        "type": "state",
        "_instance": "employee_B",
        "task": "Review team submissions",
        "status": "Blocked",
    },
]

# The Advisor seed's situation: a feature that passed unit tests, not integration tests.
# One release, as in the seed: its advisor is not instanced, so one opinion per request;
# a state message, so the advisor's scope †state.deploymentHistory names something.
_RELEASES = [
    {
        "type": "state",
        "_instance": "release-1",
        "change": "The new feature has passed unit tests but lacks integration tests.",
        "deploymentHistory": ["2 of the last 5 deploys were rolled back"],
    },
]


def seed_items(example: str) -> list[dict[str, Any]]:
    """The input messages of one seed example, as the seed writes them."""
    if example == "manager":
        return [dict(e) for e in _EMPLOYEES]
    if example == "advisors":
        return [dict(r) for r in _RELEASES]
    if example == "lazy":
        return seed_items("moderation")[:10]
    # The seed's first three comments, then 97 more of the same kind, each different: the
    # seed's point is 100 instances in one request, and twins (the same comment twice)
    # would be asked once (dedupe, on by default for a spec without a plan).
    first = ["This is a great post!", "I disagree with this...", "This is spam."]
    rest = list(dict.fromkeys(c["comment"] for c in comments(400)))[:97]
    return [
        {"type": "input", "_instance": f"c-{k + 1:03d}", "comment": text}
        for k, text in enumerate(first + rest)
    ]


async def _usage(target: Target, before: float, port: int) -> int:
    if target.sim is not None:
        return int(target.sim.stats["item_requests"] - before)
    return int((await processor_usage([port])).get("requests", 0))


async def run_example(
    bootstrap: str, target: Target, example: str, wait_s: float, items: int | None = None
) -> dict[str, Any]:
    """One seed example on its own processor and topics: its items in (the first `items`
    of them, or all), every item accounted for (lazy: every proposal approved and every
    workflow ended), its summary."""
    port = free_port()
    settings, spec, proc = await launch_processor(
        bootstrap,
        target.url,
        f"seeds-{example}-{secrets.token_hex(3)}.",
        "stream-seeds-",
        spec_path=SEEDS / f"{example}.yaml",
        STREAM_LLM_MODEL=target.model,
        STREAM_WEB_PORT=str(port),
        # The exactly-once runtime (docs/architecture.md, exactly once), where plans run.
        STREAM_DELIVERY="exactly_once",
    )
    inputs = seed_items(example)[:items]
    before = target.sim.stats["item_requests"] if target.sim is not None else 0.0
    try:
        records = [(str(i["_instance"]).encode(), orjson.dumps(i)) for i in inputs]
        await produce(bootstrap, settings.topics.input, list(records))
        report = await report_when_accounted(bootstrap, settings, spec, len(inputs), wait_s, proc)
        approved = 0
        if example == "lazy":
            approved = await approve_until_ended(bootstrap, settings, len(inputs), wait_s)
        requests = await _usage(target, before, port)
    finally:
        proc.stop()
    topics = settings.topics
    calls = [r for t in activity_topics(settings, spec) for r in await read_json(bootstrap, t)]
    no_action = await read_json(bootstrap, topics.no_action)
    letters = await read_json(bootstrap, topics.dead_letter)
    out: dict[str, Any] = {
        "items": len(inputs),
        "llm_requests": requests,
        "calls": report.calls_by_tool,
        "no_action": report.no_action,
        "state_updates": report.state_updates,
        "dead_letters": len(letters),
        "dead_letter_codes": report.dead_letters,
        "unaccounted": report.unaccounted,
        "batch_sizes": sorted(Counter(r["batch"]["size"] for r in calls).items()),
    }
    if example == "advisors":
        advice = await read_json(bootstrap, topics.advice)
        out["opinions"] = [
            {"instance": a["instance"], "advisor": o["advisor"], "votes": o.get("votes")}
            for a in advice
            for o in a["opinions"]
        ]
        out["consensus"] = {a["instance"]: a["consensus"] for a in advice}
    if example == "lazy":
        out["plans"] = await _plans(bootstrap, settings, spec, approved, letters)
    if example == "manager":
        updates = await read_json(bootstrap, topics.state_updates)
        out.update(_manager(inputs, no_action, updates, calls))
        # what a real model's answers were refused for (the simulator's are none)
        out["letters"] = [
            {"instance": d.get("instance"), "code": d["code"], "reason": str(d["reason"])[:200]}
            for d in letters
        ]
    return out


def _manager(
    items: list[dict[str, Any]],
    no_action: list[dict[str, Any]],
    state_updates: list[dict[str, Any]],
    calls: list[dict[str, Any]],
) -> dict[str, Any]:
    """Each employee's update, read from the outcome records (no plan: an answer of only
    the latent updateTask is the employee's state update record; beside a NoAction its
    output rides on that record), and how many got none: neither an update nor a call.
    The seed's answer updates employee_B and leaves employee_A alone."""
    updates: dict[str, list[dict[str, Any]]] = {str(i["_instance"]): [] for i in items}
    written = [(r, r.get("updates", [])) for r in state_updates]
    for rec, latent in [*((n, n.get("latent", [])) for n in no_action), *written]:
        for call in latent:
            fields = {k: v for k, v in call.items() if not k.startswith("_")}
            if fields:
                updates.setdefault(rec["instance"], []).append(fields)
    acted = {r["instance"] for r in calls}
    return {
        "no_action_reasons": {n["instance"]: n["reason"] for n in no_action},
        "state_updated": sorted({r["instance"] for r in state_updates}),
        "updated": {i: u for i, u in updates.items() if u},
        "untouched": sum(not u and i not in acted for i, u in updates.items()),
    }


async def approve_until_ended(
    bootstrap: str, settings: Settings, expected: int, wait_s: float
) -> int:
    """Approves every proposal as it comes (a moderator who trusts the plans) until every
    workflow has ended (or the time limit); returns how many were approved.
    Not every instance is proposed: the model may plan no call for one, which ends it,
    or its turn may end in a dead letter.
    Each approval goes keyed by its instance, to the partition its input (and state) is
    on, naming the proposal it answers."""
    deadline = time.monotonic() + wait_s
    sent: set[str] = set()
    while time.monotonic() < deadline:
        fresh = [p for p in await pending_now(settings, bootstrap) if p["proposal_id"] not in sent]
        records: list[tuple[bytes | None, bytes]] = [
            (
                str(p["instance"]).encode(),
                ApprovalRecord(
                    instance=p["instance"],
                    proposal_id=p["proposal_id"],
                    turn=p["turn"],
                    approve=True,
                )
                .model_dump_json(exclude_none=True)
                .encode(),
            )
            for p in fresh
        ]
        if records:
            await produce(bootstrap, settings.topics.approvals, records)
            sent |= {p["proposal_id"] for p in fresh}
            continue
        done = await read_json(bootstrap, settings.topics.done)
        letters = await read_json(bootstrap, settings.topics.dead_letter)
        if len(_ended(done, letters)) >= expected:
            break
        await asyncio.sleep(0.5)
    return len(sent)


def _ended(done: list[dict[str, Any]], letters: list[dict[str, Any]]) -> set[str]:
    """The instances whose workflow ended: a done record, or a dead letter that ends the
    item (a turn nobody could answer publishes no done record)."""
    return {d["instance"] for d in done} | {
        d["instance"] for d in letters if d.get("scope") == "item"
    }


async def _plans(
    bootstrap: str,
    settings: Settings,
    spec: AgentSpec,
    approved: int,
    letters: list[dict[str, Any]],
) -> dict[str, Any]:
    """What became of the model's plans: proposed, approved, the calls the approved graphs
    ran, latent steps answered before approval (a lazy plan allows none), and how many
    workflows ended (`letters`: the example's dead letters, already read)."""
    topics = settings.topics
    proposals = await read_json(bootstrap, topics.proposals)
    latent = {t.name for t in spec.tools if t.kind == "latent"}
    early = sum(
        any(not k.startswith("_") for k in call)
        for p in proposals
        for call in p["calls"]
        if call["_tool"] in latent
    )
    ran = [
        r
        for t in activity_topics(settings, spec)
        for r in await read_json(bootstrap, t)
        if str(r["batch"]["id"]).endswith("-approved")
    ]
    done = await read_json(bootstrap, topics.done)
    return {
        "proposed": len(proposals),
        "approved": approved,
        "executed_calls": len(ran),
        "latent_before_approval": early,
        "steps_per_plan": sorted(Counter(len(p["plan"]) for p in proposals).items()),
        "done": dict(Counter(d["status"] for d in done)),
        "ended": len(_ended(done, letters)),
    }


async def _all(bootstrap: str, target: Target, wait_s: float, say: Any) -> dict[str, Any]:
    started = time.monotonic()
    examples: dict[str, Any] = {}
    for example in ("moderation", "advisors", "manager", "lazy"):
        say(f"seed example {example} ...")
        examples[example] = await run_example(bootstrap, target, example, wait_s)
    return {
        "examples": examples,
        "unaccounted": sum(e["unaccounted"] for e in examples.values()),
        "elapsed_s": round(time.monotonic() - started, 2),
        "llm": target.summary(),
    }


def run_seeds(as_json: bool, timeout: float | None = None, llm: str = "simulator") -> int:
    def say(msg: str) -> None:
        print(msg, file=sys.stderr if as_json else sys.stdout, flush=True)

    with kafka_bootstrap() as bootstrap, llm_target(llm, SimConfig(latency_ms=20)) as target:
        say(f"broker {bootstrap}; {target.describe()}")
        wait_s = timeout or (120.0 if target.kind == "simulator" else 900.0)
        result = asyncio.run(_all(bootstrap, target, wait_s, say))
    if as_json:
        print(orjson.dumps(result).decode())
    else:
        for name, ex in result["examples"].items():
            say(f"{name}: {orjson.dumps(ex).decode()}")
        say(f"unaccounted: {result['unaccounted']}  elapsed: {result['elapsed_s']}s")
    return 0 if result["unaccounted"] == 0 else 1
