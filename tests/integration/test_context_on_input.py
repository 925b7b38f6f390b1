"""Context messages (a plan, an advisor, a global input) produced on the input topic, as
the seeds write a request's messages: by default each is a dead letter naming the context
topic; with the spec's `accept_context_input` each is forwarded there, in the reading
unit's transaction, and a later item is decided under it. `stream audit` counts each."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml
from instanced_stream.settings import DEFAULT_SPEC, EXAMPLES
from instanced_stream_bench.harness.seeds import seed_items
from instanced_stream_bench.testing.samples import tickets

from tests.conftest import Deployment
from tests.flows import until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

Deploy = Callable[..., Awaitable[Deployment]]

PLAN = {"type": "plan", "mode": "lazy", "steps": ["look up the customer", "route the ticket"]}
ADVISOR = {
    "type": "advisor",
    "id": "brandGuardian",
    "role": "Guard the brand voice",
    "on": "request",
    "isInstanced": True,
    "schema": {"type": "object", "properties": {"tone": {"type": "string"}}},
}
INSTRUCTION = {
    "type": "input",
    "instruction": "Give employee B a new, high-priority task to 'Finalize the quarterly report'.",
}


def _spec(tmp_path: Path, base: Path, drop: str = "", **changes: Any) -> str:
    """`base` with `changes` (and without its `drop` key), written for the processor."""
    data = yaml.safe_load(base.read_text().replace("\n    on: ", "\n    'on': "))
    data.update(changes)
    if drop:
        del data[drop]
    path = tmp_path / "agent.yaml"
    # Quoted: YAML 1.1 would read a bare `on` key as true.
    path.write_text(yaml.safe_dump(data, allow_unicode=True).replace("\n  on:", "\n  'on':"))
    return str(path)


async def _context_applied(dep: Deployment, mark: str) -> bool:
    """The processor logged a context change holding `mark` (its follower applied it)."""
    return any(
        "context changed" in line and mark in line for line in dep.proc.tail(400).split("\n")
    )


async def _forwarded(dep: Deployment) -> list[tuple[bytes | None, Any]]:
    """The context topic's records: (key, message)."""
    from instanced_stream.kafka.topics import read_topic

    return [
        (rec.key, orjson.loads(rec.value))
        async for rec in read_topic(dep.bootstrap, dep.settings.topics.context)
    ]


async def test_context_messages_on_the_input_topic_are_dead_letters_naming_the_context_topic(
    deploy: Deploy,
) -> None:
    dep = await deploy()
    item = {"_instance": "c-1", "comment": "Thanks for the notes."}
    await dep.produce(
        [(None, orjson.dumps(m)) for m in (PLAN, ADVISOR, INSTRUCTION)]
        + [(b"c-1", orjson.dumps(item))]
    )
    report = await dep.settle(4)
    assert report.unaccounted == 0 and report.item_dead_letters == 3
    assert report.context_forwarded == 0
    letters = await dep.records(dep.settings.topics.dead_letter)
    assert sorted(letter["code"] for letter in letters) == ["context_on_input"] * 3
    for letter in letters:
        assert dep.settings.topics.context in letter["reason"]
        assert "accept_context_input: true" in letter["reason"]
    said = {letter["reason"].removeprefix("a type: ").split()[0] for letter in letters}
    assert said == {"plan", "advisor", "input"}
    assert await _forwarded(dep) == []  # nothing reached the context topic
    calls = await dep.records(dep.activity_topic("moderateComment"))
    assert [c["instance"] for c in calls] == ["c-1"]  # the item beside them went on


async def test_an_advisor_sent_to_the_input_topic_is_heard_on_later_items(
    deploy: Deploy, tmp_path: Path
) -> None:
    dep = await deploy(spec_path=Path(_spec(tmp_path, DEFAULT_SPEC, accept_context_input=True)))
    await dep.produce([(None, orjson.dumps(ADVISOR))])
    assert await until(lambda: _context_applied(dep, "4 advisors"), 60)
    await dep.produce_items([{"_instance": "later-1", "comment": "Thanks for the notes."}])
    report = await dep.settle(2)
    assert report.unaccounted == 0 and report.item_dead_letters == 0
    assert report.context_forwarded == 1 and report.duplicate_outcomes == 0
    assert await _forwarded(dep) == [(b"brandGuardian", ADVISOR)]
    (advice,) = await dep.records(dep.settings.topics.advice)
    assert advice["instance"] == "later-1"
    assert "brandGuardian" in {o["advisor"] for o in advice["opinions"]}


async def test_a_global_input_sent_to_the_input_topic_decides_later_items(
    deploy: Deploy, tmp_path: Path
) -> None:
    # The manager seed without its spec-held instruction: it comes on the input topic.
    manager = EXAMPLES / "seeds" / "manager.yaml"
    spec = _spec(tmp_path, manager, drop="inputs", accept_context_input=True)
    dep = await deploy(spec_path=Path(spec))
    await dep.produce([(None, orjson.dumps(INSTRUCTION))])
    assert await until(lambda: _context_applied(dep, "1 global inputs"), 60)
    await dep.produce_items(seed_items("manager"))
    report = await dep.settle(3)
    assert report.unaccounted == 0 and report.item_dead_letters == 0
    assert report.context_forwarded == 1
    ((key, message),) = await _forwarded(dep)
    assert message == INSTRUCTION and key is not None and key.startswith(b"input@")
    (untouched,) = await dep.records(dep.settings.topics.no_action)
    assert untouched["instance"] == "employee_A" and untouched["latent"] == []
    (record,) = await dep.records(dep.settings.topics.state_updates)
    assert record["instance"] == "employee_B"
    (update,) = record["updates"]
    # the instruction's own words: it was decided under the forwarded global input
    assert "Finalize the quarterly report" in (update["newTask"], update["newStatus"])


async def test_a_plan_sent_to_the_input_topic_steers_later_items(
    deploy: Deploy, tmp_path: Path
) -> None:
    spec = _spec(tmp_path, EXAMPLES / "tickets" / "agent.yaml", accept_context_input=True)
    dep = await deploy(spec_path=Path(spec))
    before, after = tickets(2)
    await dep.produce_items([before])
    await dep.settle(1)  # decided under the spec's eager plan: its calls are published
    assert not await dep.records(dep.settings.topics.proposals)
    await dep.produce([(None, orjson.dumps(PLAN))])
    assert await until(lambda: _context_applied(dep, "context changed"), 60)
    await dep.produce_items([after])
    report = await dep.settle(3)
    assert report.unaccounted == 0 and report.context_forwarded == 1
    assert await _forwarded(dep) == [(b"plan", PLAN)]
    proposals = await dep.records(dep.settings.topics.proposals)
    assert [p["instance"] for p in proposals] == [after["_instance"]]  # planned lazily
