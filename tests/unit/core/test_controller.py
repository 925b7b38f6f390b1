"""The window controller (shrink fast, grow slowly, a minimum sample) and the shadow
sample on the in-memory simulator; the Wilson bounds it judges by are test_quality.py's."""

from __future__ import annotations

import asyncio
import random

import pytest
from instanced_stream.core.controller import WindowController
from instanced_stream.core.live_spec import LiveSpec
from instanced_stream.core.prompt import PromptBuilder
from instanced_stream.core.quality import Quality, bucket_of, z_of
from instanced_stream.core.solve import Solver
from instanced_stream.core.spec import load_spec
from instanced_stream.core.validate import Validator
from instanced_stream.errors import SpecError
from instanced_stream.observe.metrics import Metrics
from instanced_stream.runtime.quality.escalation import Escalation
from instanced_stream.runtime.quality.shadow import Shadow
from instanced_stream.settings import EXAMPLES
from instanced_stream_bench.testing.sim.account import Faults, SimConfig
from instanced_stream_bench.testing.sim.server import Simulator

from tests.fakes import FakeLLM, make_batch

Z = z_of(0.95)


def test_no_decision_below_the_minimum_sample() -> None:
    c = WindowController(max_items=25, target=0.9, min_sample=10, z=Z)
    for _ in range(9):
        assert c.observe(25, False) is None  # nine disagreements: not yet a sample
    assert c.window == 25
    change = c.observe(25, False)
    assert change is not None and change.new == 12 and change.compared == 10
    assert "shrinks 25 -> 12" in change.why and "0/10" in change.why


def test_shrinks_fast_to_the_window_that_agrees() -> None:
    c = WindowController(max_items=25, target=0.9, min_sample=10, z=Z)
    bad = {"16-31", "8-15", "4-7"}  # agreement collapses from 4 items up
    changes: list[tuple[int, int]] = []
    while len(changes) < 3:
        size = c.window
        change = c.observe(size, bucket_of(size) not in bad)
        if change is not None:
            changes.append((change.old, change.new))
    assert changes == [(25, 12), (12, 6), (6, 3)]
    # 3 agrees: it stays there (a perfect record, and the next size up is known bad).
    for _ in range(200):
        assert c.observe(3, True) is None or c.window <= 3
    assert c.window == 3


def test_grows_slowly_only_on_a_proven_record() -> None:
    c = WindowController(max_items=20, target=0.9, min_sample=10, z=Z)
    c.window = 4
    grown = []
    for _ in range(400):
        change = c.observe(c.window, True)
        if change is not None:
            assert change.new > change.old and change.lower >= 0.9
            grown.append(change.new)
    # a quarter at a time (at least one), never past max_items
    assert grown[:4] == [5, 6, 7, 8] and grown[-1] == 20 and c.window == 20
    # a perfect record needs this many comparisons before its lower bound reaches 0.9
    assert c.proof == 35


def test_an_uncertain_record_neither_shrinks_nor_grows() -> None:
    c = WindowController(max_items=25, target=0.9, min_sample=10, z=Z)
    # 85%: the upper bound stays above 0.9 on a small sample, the lower bound below.
    pattern = [True] * 17 + [False] * 3
    for ok in pattern:
        assert c.observe(25, ok) is None
    assert c.window == 25


def test_quality_needs_a_sample_to_follow(tmp_path) -> None:  # type: ignore[no-untyped-def]
    assert Quality().shadow_rate == 0 and Quality().min_agreement is None
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        (EXAMPLES / "seed_moderation" / "agent.yaml")
        .read_text()
        .replace("shadow_rate: 0.3", "shadow_rate: 0")
    )
    with pytest.raises(SpecError, match=r"quality\.min_agreement needs quality\.shadow_rate"):
        load_spec(spec)


async def _shadowed(disagree: float) -> tuple[Metrics, list[int], FakeLLM]:
    spec = load_spec(EXAMPLES / "seed_moderation" / "agent.yaml")
    spec = spec.model_copy(
        update={
            "quality": spec.quality.model_copy(update={"shadow_rate": 1.0, "min_sample": 10}),
            "window": spec.window.model_copy(update={"max_items": 8}),
        }
    )
    sim = Simulator(SimConfig(classifier=False, faults=Faults(disagree_rate=disagree)))
    llm = FakeLLM(sim)
    metrics = Metrics(spec.model, spec.window.max_items)
    sizes: list[int] = []
    live = LiveSpec(spec)
    shadow = Shadow(live, llm, metrics, 3, sizes.append, random.Random(1))
    solver = Solver(llm, PromptBuilder(spec), Validator(spec), 3)
    texts = [f"comment number {k} is {'stupid' if k % 3 else 'fine'}" for k in range(40)]
    for k in range(0, 40, 8):
        shadow.offer(await solver.solve(make_batch(texts[k : k + 8], f"b{k}-")), live.edition)
        await asyncio.gather(*shadow.tasks)
    return metrics, sizes, llm


async def test_shadow_agrees_on_the_simulator_and_never_shrinks() -> None:
    metrics, sizes, llm = await _shadowed(0.0)
    live = metrics.agreement.live()
    assert live["shadowed"] == 40 and live["compared"] == 40 and live["agreement"] == 1.0
    assert live["window_now"] == 8 and sizes == []
    assert live["shadow_tokens"]["prompt"] > 0  # counted, and in the stream's totals
    assert sum(len(r) == 1 for r in llm.requests) == 40


async def test_injected_disagreement_shrinks_the_window() -> None:
    metrics, sizes, _ = await _shadowed(0.6)
    live = metrics.agreement.live()
    assert live["agreement"] is not None and live["agreement"] < 0.7
    assert sizes and sizes[0] == 4 and live["window_now"] == sizes[-1] < 8
    assert live["changes"][0]["compared"] >= 10 and live["changes"][0]["upper"] < 0.9


async def test_reasked_items_get_a_second_opinion_alone_before_publishing() -> None:
    spec = load_spec(EXAMPLES / "seed_moderation" / "agent.yaml")
    quality = spec.quality.model_copy(update={"escalate_on": "reask"})
    spec = spec.model_copy(update={"quality": quality})
    sim = Simulator(SimConfig(classifier=False))
    llm = FakeLLM(sim)
    metrics = Metrics(spec.model, 8)
    texts = [f"note {k}" for k in range(7)] + ["skipped once [[sim:skip-once]]"]
    outcome = await Solver(llm, PromptBuilder(spec), Validator(spec), 3).solve(make_batch(texts))
    reasked = [a for a in outcome.answers if a.attempt > 1]
    assert len(reasked) == 1 and reasked[0].size == 1  # the re-ask was of that one item
    edition = LiveSpec(spec).edition
    escalation = Escalation(llm, metrics, 3)
    await escalation.review(outcome, edition)
    assert metrics.agreement.second_opinions == 0  # already answered alone: nothing to add
    second = FakeLLM(sim)
    escalation = Escalation(llm, metrics, 3, second=second)
    await escalation.review(outcome, edition)
    assert metrics.agreement.second_opinions == 1 and len(second.requests) == 1
    assert len(outcome.answers) == 8 and outcome.answers[-1].instance.id == "id-7"
    never = Escalation(llm, metrics, 3, second)
    await never.review(outcome, LiveSpec(spec.model_copy(update={"quality": Quality()})).edition)
    assert len(second.requests) == 1
