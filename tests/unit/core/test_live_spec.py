"""The live spec (core/live_spec.py): one holder of the spec and of what is derived from
it once per change; a change is installed whole or refused whole, and its followers are
told after it is live."""

from __future__ import annotations

import pytest
from instanced_stream.core.live_spec import Edition, LiveSpec
from instanced_stream.core.spec import AgentSpec, load_spec
from instanced_stream.errors import SpecError
from instanced_stream.settings import DEFAULT_SPEC

from tests.fakes import FakeLLM


def _stricter(spec: AgentSpec) -> AgentSpec:
    return spec.model_copy(update={"instructions": "Moderate strictly."})


def test_a_change_is_a_new_edition_derived_once() -> None:
    spec = load_spec(DEFAULT_SPEC)
    live = LiveSpec(spec)
    first = live.edition
    assert live.spec is spec and first.spec is spec and first.prompt.spec is spec
    assert live.edition is first  # read again: the same derivation, not a new one
    changed = _stricter(spec)
    installed = live.install(changed)
    assert live.edition is installed and live.spec is changed
    assert installed.version > first.version
    assert installed.prompt is not first.prompt and "Moderate strictly." in installed.system
    assert "Moderate strictly." not in first.system  # an edition never changes


def test_a_refused_change_leaves_the_live_spec_and_tells_no_follower() -> None:
    spec = load_spec(DEFAULT_SPEC)
    live = LiveSpec(spec)
    first = live.edition
    told: list[Edition] = []
    asked: list[int] = []

    def refuse(edition: Edition) -> None:
        asked.append(edition.version)
        if "strictly" in edition.spec.instructions:
            raise SpecError("too strict")

    live.check(refuse)
    live.follow(told.append)
    with pytest.raises(SpecError, match="too strict"):
        live.install(_stricter(spec))
    assert live.edition is first and told == []
    again = live.install(spec.model_copy(update={"instructions": "Moderate kindly."}))
    assert told == [again]
    assert len(set(asked)) == 2 and again.version == asked[-1]  # a refused number is not reused


def test_followers_are_told_in_the_order_they_asked_with_the_edition_live() -> None:
    live = LiveSpec(load_spec(DEFAULT_SPEC))
    order: list[str] = []
    live.follow(lambda e: order.append(f"a{int(live.edition is e)}"))
    live.follow(lambda e: order.append(f"b{int(live.edition is e)}"))
    live.install(_stricter(live.spec))
    assert order == ["a1", "b1"]


def test_an_editions_solver_is_its_prompt_and_validator_on_a_model() -> None:
    spec = load_spec(DEFAULT_SPEC)
    edition = LiveSpec(spec).edition
    llm = FakeLLM()
    solver = edition.solver(llm, 3)
    assert solver.prompt is edition.prompt and solver.validator is edition.validator
    assert solver.llm is llm and solver.max_attempts == 3
    assert solver.max_consults == spec.advice.max_consults
    assert edition.solver(llm, 3, max_consults=0).max_consults == 0
