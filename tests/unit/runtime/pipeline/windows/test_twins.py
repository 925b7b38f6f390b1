"""Twins (runtime/pipeline/windows/twins.py): the content key, the split of a window, the expansion
of its outcome to every twin, and the answer cache's TTL and bound."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from instanced_stream.core.dedupe import content_key
from instanced_stream.core.instance import Instance
from instanced_stream.core.live_spec import LiveSpec
from instanced_stream.core.messages import Call, SourcePosition
from instanced_stream.core.solve import Answer, Outcome, Unanswered
from instanced_stream.core.spec import AgentSpec
from instanced_stream.runtime.pipeline.windows.twins import AnswerCache, Twins, merge
from instanced_stream.runtime.pipeline.windows.windowing import FixedSize, Windower

SPEC: dict[str, Any] = {
    "name": "t",
    "instructions": "Moderate.",
    "tools": [{"name": "moderate", "description": "d", "parameters": {"type": "object"}}],
    "dedupe": {"enabled": True, "cache_ttl_s": 60, "cache_items": 2},
}


def _inst(offset: int, comment: str, **extra: Any) -> Instance:
    source = SourcePosition(topic="in", partition=0, offset=offset)
    return Instance(f"id-{offset}", {"comment": comment, **extra}, source, 10)


def _answer(inst: Instance, decision: str = "approve") -> Answer:
    call = Call.model_validate({"_tool": "moderate", "_instance": "1", "decision": decision})
    return Answer(inst, [call], "1", 1, 1)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _twins(spec: dict[str, Any] = SPEC, clock: Clock | None = None) -> Twins:
    parsed = AgentSpec.model_validate(spec)
    return Twins(LiveSpec(parsed), clock or Clock())


def test_the_content_key_ignores_ids_positions_key_order_and_runs_of_whitespace() -> None:
    a = _inst(1, "Buy  now!\n", author="x")
    b = Instance("other", {"author": "x", "comment": " Buy now! ", "_instance": "q"}, a.source, 3)
    assert content_key(a, False) == content_key(b, False)
    assert content_key(a, True) != content_key(b, True)  # ids shown: the id is content
    assert content_key(a, False) != content_key(_inst(1, "Buy now?", author="x"), False)
    assert content_key(a, False) != content_key(_inst(1, "Buy now!", author="y"), False)


def test_a_window_asks_each_content_once_and_every_twin_gets_its_own_answer() -> None:
    twins = _twins()
    items = [_inst(0, "a"), _inst(1, "b"), _inst(2, " a"), _inst(3, "a  ")]
    split = twins.split(items)
    assert split.asked == items[:2] and split.spared == 2
    outcome = Outcome(answers=[_answer(items[0]), _answer(items[1], "reject")])
    done = twins.expand(outcome, split)
    got = {a.instance.id: a.calls[0].arguments["decision"] for a in done.answers}
    assert got == {"id-0": "approve", "id-1": "reject", "id-2": "approve", "id-3": "approve"}
    assert [a.instance.source.offset for a in done.answers].count(2) == 1  # its own source


def test_an_unanswered_stand_in_leaves_its_twins_unanswered_with_its_reason() -> None:
    twins = _twins()
    items = [_inst(0, "a"), _inst(1, "a")]
    split = twins.split(items)
    outcome = Outcome(unanswered=[Unanswered(items[0], "unanswered", "no answer", 3)])
    done = twins.expand(outcome, split)
    assert [(u.instance.id, u.code, u.reason) for u in done.unanswered] == [
        ("id-0", "unanswered", "no answer"),
        ("id-1", "unanswered", "no answer"),
    ]
    assert twins.split([_inst(5, "a")]).asked  # nothing cached from a failure


def test_the_cache_answers_later_windows_within_its_ttl_only() -> None:
    clock = Clock()
    twins = _twins(clock=clock)
    first = twins.split([_inst(0, "a")])
    twins.expand(Outcome(answers=[_answer(first.asked[0], "reject")]), first)
    clock.now = 59.0
    later = twins.split([_inst(7, "a")])
    assert later.asked == [] and later.spared == 1
    done = twins.expand(Outcome(), later)
    assert [(a.instance.id, a.calls[0].arguments["decision"]) for a in done.answers] == [
        ("id-7", "reject")
    ]
    clock.now = 61.0
    assert [i.id for i in twins.split([_inst(8, "a")]).asked] == ["id-8"]


def test_another_spec_fingerprint_is_another_cache() -> None:
    twins = _twins()
    first = twins.split([_inst(0, "a")])
    twins.expand(Outcome(answers=[_answer(first.asked[0])]), first)
    changed = AgentSpec.model_validate({**SPEC, "instructions": "Moderate strictly."})
    twins.live.install(changed)
    assert len(twins.split([_inst(1, "a")]).asked) == 1


def test_a_batch_launched_before_a_change_caches_under_the_spec_it_asked_on() -> None:
    twins = _twins()
    launched = twins.live.edition  # the batch's, taken at its launch
    twins.live.install(AgentSpec.model_validate({**SPEC, "instructions": "Moderate strictly."}))
    first = twins.split([_inst(0, "a")], launched)
    twins.expand(Outcome(answers=[_answer(first.asked[0])]), first)
    assert twins.split([_inst(1, "a")], launched).asked == []  # that spec's answer, cached
    assert len(twins.split([_inst(2, "a")]).asked) == 1  # the live spec's is another cache


def test_the_cache_is_bounded_least_recently_used_first() -> None:
    cache = AnswerCache(60, 2, Clock())
    for key in ("a", "b", "c"):
        cache.put(key, _answer(_inst(0, key)))
    assert len(cache) == 2 and cache.get("a") is None and cache.get("c") is not None


def test_on_by_default_off_for_stateful_specs_unless_asked() -> None:
    plain = {k: v for k, v in SPEC.items() if k != "dedupe"}
    items = [_inst(0, "a"), _inst(1, "a")]
    assert len(_twins(plain).split(items).asked) == 1
    off = {**plain, "dedupe": {"enabled": False}}
    assert _twins(off).split(items).asked == items
    stateful = {**plain, "plan": {"mode": "eager", "steps": ["decide"]}}
    assert _twins(stateful).split(items).asked == items
    opted = {**stateful, "dedupe": {**SPEC["dedupe"], "stateful": True}}
    assert len(_twins(opted).split(items).asked) == 1


async def _asked_once(
    twins: Twins, instances: list[Instance], ask: Callable[[list[Instance]], Awaitable[Outcome]]
) -> Outcome:
    """One window through the twins, in the steps `Dispatch._once` takes."""
    split = twins.split(instances)
    try:
        outcome = await ask(split.asked)
    except BaseException:
        twins.settle(split, None)
        raise
    twins.settle(split, outcome)
    alone = await twins.waited(split)
    if alone:
        merge(outcome, await ask(alone))
    return twins.expand(outcome, split)


async def test_a_content_in_flight_is_not_asked_again_by_another_batch() -> None:
    twins = _twins()
    asked: list[list[str]] = []
    release = asyncio.Event()

    async def ask(instances: list[Instance]) -> Outcome:
        asked.append([i.id for i in instances])
        await release.wait()
        return Outcome(answers=[_answer(i, "reject") for i in instances])

    first = asyncio.create_task(_asked_once(twins, [_inst(0, "a"), _inst(1, "b")], ask))
    await asyncio.sleep(0)  # the first batch is asking
    second = asyncio.create_task(_asked_once(twins, [_inst(2, "a"), _inst(3, "c")], ask))
    await asyncio.sleep(0)
    release.set()
    done = await second
    assert asked == [["id-0", "id-1"], ["id-3"]]  # "a" asked once
    assert sorted(a.instance.id for a in done.answers) == ["id-2", "id-3"]
    assert done.spared == 1
    assert len((await first).answers) == 2


async def test_a_twin_whose_asking_batch_failed_is_asked_by_its_own() -> None:
    twins = _twins()
    started = asyncio.Event()
    asked: list[str] = []

    async def failing(instances: list[Instance]) -> Outcome:
        started.set()
        await asyncio.sleep(0.01)
        raise RuntimeError("the batch's step raised")

    async def ask(instances: list[Instance]) -> Outcome:
        asked.extend(i.id for i in instances)
        return Outcome(answers=[_answer(i) for i in instances])

    first = asyncio.create_task(_asked_once(twins, [_inst(0, "a")], failing))
    await started.wait()
    done = await _asked_once(twins, [_inst(1, "a")], ask)
    assert asked == ["id-1"] and [a.instance.id for a in done.answers] == ["id-1"]
    with pytest.raises(RuntimeError):
        await first


def test_a_twin_takes_no_place_in_the_open_window() -> None:
    twins = _twins()
    assert [twins.free(_inst(k, c)) for k, c in enumerate("abab")] == [False, False, True, True]
    twins.closed()
    assert twins.free(_inst(9, "a")) is False  # a new window: its first "a" is asked


async def test_the_windower_closes_on_items_that_are_asked_not_on_their_twins() -> None:
    twins = _twins()
    closed: list[list[str]] = []

    async def on_close(items: list[Instance], reason: str) -> None:
        twins.closed()
        closed.append([i.id for i in items])

    windower: Windower[Instance] = Windower(
        size=FixedSize(2, 10_000),
        max_wait_s=60,
        on_close=on_close,
        tokens_of=lambda i: 1,
        free=twins.free,
    )
    for k, comment in enumerate(["a", "a", "a", "b", "c"]):
        await windower.add(_inst(k, comment))
    assert closed == [["id-0", "id-1", "id-2", "id-3"]]  # "a" and "b" asked, twins free


async def test_a_content_answered_is_cached_before_the_batch_waits_for_its_own_twins() -> None:
    twins = _twins()
    release = asyncio.Event()
    asked: list[str] = []

    async def slow(instances: list[Instance]) -> Outcome:
        asked.extend(i.id for i in instances)
        await release.wait()
        return Outcome(answers=[_answer(i) for i in instances])

    async def fast(instances: list[Instance]) -> Outcome:
        asked.extend(i.id for i in instances)
        return Outcome(answers=[_answer(i) for i in instances])

    # B asks "b" slowly; A asks "a" and waits for B's "b": while A waits, "a" is answered.
    b = asyncio.create_task(_asked_once(twins, [_inst(0, "b")], slow))
    await asyncio.sleep(0)
    a = asyncio.create_task(_asked_once(twins, [_inst(1, "a"), _inst(2, "b")], fast))
    await asyncio.sleep(0)
    assert not a.done()  # A waits for B's answer of "b"
    later = twins.split([_inst(3, "a")])  # a third batch meanwhile: "a" is cached
    assert later.asked == [] and asked == ["id-0", "id-1"]
    release.set()
    await asyncio.gather(a, b)
