from __future__ import annotations

from typing import Any

import pytest
from instanced_stream.core.instance import Instance
from instanced_stream.core.prompt import PromptBuilder
from instanced_stream.core.solve import Solver
from instanced_stream.core.spec import load_spec
from instanced_stream.core.validate import Validator
from instanced_stream.settings import DEFAULT_SPEC
from pydantic import ValidationError

from tests.fakes import FakeLLM, make_batch


def _batch(texts: list[str]) -> list[Instance]:
    return make_batch(texts, "id-")


def _solver(fake: FakeLLM, attempts: int = 3) -> Solver:
    spec = load_spec(DEFAULT_SPEC)
    return Solver(fake, PromptBuilder(spec), Validator(spec), attempts)


def _answered(outcome: Any) -> set[str]:
    return {a.instance.id for a in outcome.answers}


async def test_one_request_answers_the_whole_batch() -> None:
    fake = FakeLLM()
    out = await _solver(fake).solve(_batch([f"nice post number {i}" for i in range(10)]))
    assert len(fake.requests) == 1
    assert len(fake.requests[0]) == 10
    assert _answered(out) == {f"id-{i}" for i in range(10)}
    assert not out.unanswered


async def test_skipped_instance_is_asked_again_alone() -> None:
    fake = FakeLLM()
    out = await _solver(fake).solve(_batch(["fine", "fine too [[sim:skip-once]]", "also fine"]))
    assert [len(r) for r in fake.requests] == [3, 1]
    assert fake.requests[1][0]["comment"].endswith("[[sim:skip-once]]")
    assert _answered(out) == {"id-0", "id-1", "id-2"}
    assert next(a for a in out.answers if a.instance.id == "id-1").attempt == 2


async def test_always_skipped_instance_ends_unanswered_after_max_attempts() -> None:
    fake = FakeLLM()
    out = await _solver(fake, attempts=3).solve(_batch(["ok", "never [[sim:skip-always]]"]))
    assert [u.instance.id for u in out.unanswered] == ["id-1"]
    assert out.unanswered[0].code == "unanswered"
    assert out.unanswered[0].attempts == 3
    assert len(fake.requests) == 3


async def test_poison_item_is_isolated_by_splitting() -> None:
    fake = FakeLLM()
    texts = [f"clean {i}" for i in range(8)]
    texts[5] = "derails the model [[sim:poison]]"
    out = await _solver(fake, attempts=2).solve(_batch(texts))
    assert [u.instance.id for u in out.unanswered] == ["id-5"]
    assert "not JSON" in out.unanswered[0].reason
    assert _answered(out) == {f"id-{i}" for i in range(8)} - {"id-5"}


async def test_refused_request_isolates_the_item_with_llm_rejected() -> None:
    fake = FakeLLM()
    fake.reject_marker = "FORBIDDEN"
    out = await _solver(fake).solve(_batch(["a", "b", "FORBIDDEN text", "d"]))
    assert [(u.instance.id, u.code) for u in out.unanswered] == [("id-2", "llm_rejected")]
    assert _answered(out) == {"id-0", "id-1", "id-3"}


async def test_invented_and_unknown_tool_calls_are_refused_not_accepted() -> None:
    fake = FakeLLM()
    out = await _solver(fake).solve(_batch(["a [[sim:invent]]", "b [[sim:unknown-tool]]"]))
    codes = sorted(r.code for r, _, _ in out.refusals)
    assert codes == ["unknown_instance", "unknown_tool", "unknown_tool", "unknown_tool"]
    # id-1 never gets a valid call: its only call names an unknown tool every time
    assert [u.instance.id for u in out.unanswered] == ["id-1"]
    assert all(c.instance in ("①", "②") for a in out.answers for c in a.calls)


async def test_consult_round_trip_asks_again_with_the_on_demand_advisor() -> None:
    fake = FakeLLM()
    out = await _solver(fake).solve(_batch(["clear and kind", "hmm [[sim:consult]]", "fine"]))
    assert [len(r) for r in fake.requests] == [3, 1]
    first, follow = fake.asks
    assert first.may_consult and "legalCounsel" not in first.active
    assert "legalCounsel" in follow.active and not follow.may_consult
    assert out.consults == 1
    consulted = next(a for a in out.answers if a.instance.id == "id-1")
    assert consulted.consulted == ["legalCounsel"]
    assert {o.advisor for o in consulted.opinions} == {
        "safetyOfficer",
        "communityManager",
        "legalCounsel",
    }
    assert all(c.tool != "ConsultAdvisor" for a in out.answers for c in a.calls)
    plain = next(a for a in out.answers if a.instance.id == "id-0")
    assert {o.advisor for o in plain.opinions} == {"safetyOfficer", "communityManager"}
    safety = next(o for o in plain.opinions if o.advisor == "safetyOfficer")
    assert safety.token == plain.token and safety.error is None


async def test_a_window_that_times_out_is_split_until_it_answers_in_time() -> None:
    fake = FakeLLM()
    fake.timeout_over = 3
    out = await _solver(fake).solve(_batch([f"post {i}" for i in range(8)]))
    # Halves run one after the other, each split again until it fits the time limit.
    assert [len(r) for r in fake.requests] == [8, 4, 2, 2, 4, 2, 2]
    assert _answered(out) == {f"id-{i}" for i in range(8)}
    assert not out.unanswered


async def test_an_item_that_always_times_out_is_dead_lettered_after_max_attempts() -> None:
    fake = FakeLLM()
    fake.timeout_marker = "ENDLESS"
    out = await _solver(fake, attempts=2).solve(_batch(["a", "b", "ENDLESS essay", "d"]))
    assert [(u.instance.id, u.code) for u in out.unanswered] == [("id-2", "llm_timeout")]
    assert "no answer in time" in out.unanswered[0].reason
    assert _answered(out) == {"id-0", "id-1", "id-3"}


async def test_a_re_ask_tells_the_model_why_its_last_answer_was_refused() -> None:
    fake = FakeLLM()
    out = await _solver(fake).solve(_batch(["fine", "wrong args [[sim:bad-args]]"]))
    assert [len(r) for r in fake.requests] == [2, 1, 1]
    first, second, _ = fake.messages
    assert all("did not settle" not in m["content"] for m in first)
    # The reasons come after the unchanged system prompt (the cached prefix).
    assert second[0] == first[0]
    assert "bad_arguments" in second[-1]["content"] and second[-1]["content"].startswith("Your")
    assert "1:" in second[-1]["content"]  # the instance's number (compact form) in the re-ask
    assert _answered(out) == {"id-0"}
    # The dead letter names the last refusal, not only "no valid call".
    assert [u.instance.id for u in out.unanswered] == ["id-1"]
    assert out.unanswered[0].reason.startswith("bad_arguments: ")


def _bound_spec(**advisor: Any) -> Any:
    """The example spec with the Advisor seed's instanced definition: `_instance` names
    the one instance it speaks about."""
    spec = load_spec(DEFAULT_SPEC)
    bound = {
        "id": "mentorOfOne",
        "role": "Speaks for one author only",
        "on": "request",
        "isInstanced": True,
        "_instance": "id-1",
        **advisor,
    }
    data = spec.model_dump(by_alias=True)
    return type(spec).model_validate({**data, "advisors": [*data["advisors"], bound]})


async def test_an_advisor_defined_for_one_instance_speaks_about_that_instance_only() -> None:
    spec = _bound_spec()
    fake = FakeLLM()
    solver = Solver(fake, PromptBuilder(spec), Validator(spec), 3)
    out = await solver.solve(_batch(["fine", "also fine", "fine too"]))
    assert _answered(out) == {"id-0", "id-1", "id-2"}
    heard = {a.instance.id: {o.advisor for o in a.opinions} for a in out.answers}
    assert "mentorOfOne" in heard["id-1"]
    assert "mentorOfOne" not in heard["id-0"] | heard["id-2"]
    # asked apart: the request that holds it names it active, the other does not
    by_active = {("mentorOfOne" in ask.active): len(ask.items) for ask in fake.asks}
    assert by_active == {True: 1, False: 2}
    # the producer's id stays out of the prompt: the model sees tokens only
    assert "id-1" not in PromptBuilder(spec).system


def test_an_advisor_for_one_instance_must_be_instanced() -> None:
    with pytest.raises(ValidationError, match="needs isInstanced: true"):
        _bound_spec(isInstanced=False)
