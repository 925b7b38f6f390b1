"""Advice that gates must exist (#26 item 4): an instanced advisor's missing opinion is
asked for again once, then the gate fails closed; a non-instanced advisor's one opinion
(about the whole request: in a stream, an arbitrary window) never gates one item's call."""

from __future__ import annotations

from typing import Any

import orjson
from instanced_stream.core.advice import summarise
from instanced_stream.core.instance import Instance
from instanced_stream.core.live_spec import LiveSpec
from instanced_stream.core.messages import Call, SourcePosition
from instanced_stream.core.model import Completion
from instanced_stream.core.prompt import PromptBuilder
from instanced_stream.core.solve import Answer, Outcome, Solver
from instanced_stream.core.spec import AgentSpec
from instanced_stream.core.validate import Opinion, Validator
from instanced_stream.runtime.pipeline.outcomes.records import RecordBuilder
from instanced_stream.settings import Settings


def _spec(mode: str = "gate") -> AgentSpec:
    return AgentSpec.model_validate(
        {
            "name": "g",
            "instructions": "decide",
            "model": {"answer": "protocol"},
            "advice": {"mode": mode},
            "tools": [
                {"name": "approve", "description": "a"},
                {"name": "reject", "description": "r"},
            ],
            "advisors": [
                {"id": "judge", "role": "r", "on": "request", "isInstanced": True},
                {"id": "crowd", "role": "r", "on": "request"},
            ],
        }
    )


class _Canned:
    """Answers with the given texts in turn (the last one repeated)."""

    model = "canned"

    def __init__(self, *texts: dict[str, Any]) -> None:
        self.texts = [orjson.dumps(t).decode() for t in texts]
        self.asked: list[list[dict[str, str]]] = []

    async def complete(
        self, messages: list[dict[str, str]], response_format: dict[str, Any], **_: Any
    ) -> Completion:
        self.asked.append(messages)
        text = self.texts[min(len(self.asked), len(self.texts)) - 1]
        return Completion(text, "stop", 10, 5, 0, 0.01)

    async def close(self) -> None:
        return None


def _inst() -> Instance:
    return Instance("a", {"text": "x"}, SourcePosition(topic="t", partition=0, offset=0), 10)


CALL = {"_tool": "approve", "_instance": "①", "_reasoningForCall": "ok"}
CROWD = {"id": "crowd", "calls": '{"approve": 90}'}
JUDGE = {"id": "judge", "_instance": "①", "calls": '{"approve": 80}'}


async def test_a_missing_instanced_opinion_is_asked_again_once() -> None:
    llm = _Canned(
        {"advisors": [CROWD], "calls": [CALL]}, {"advisors": [CROWD, JUDGE], "calls": [CALL]}
    )
    spec = _spec()
    outcome = await Solver(llm, PromptBuilder(spec), Validator(spec), 3).solve([_inst()])
    assert len(llm.asked) == 2 and "judge" in llm.asked[1][-1]["content"]
    (answer,) = outcome.answers
    assert answer.unheard == []


async def test_still_missing_after_the_re_ask_the_answer_names_it_unheard() -> None:
    llm = _Canned({"advisors": [CROWD], "calls": [CALL]})
    spec = _spec()
    outcome = await Solver(llm, PromptBuilder(spec), Validator(spec), 3).solve([_inst()])
    (answer,) = outcome.answers
    assert answer.unheard == ["judge"] and len(llm.asked) == 2


async def test_where_advice_only_records_a_silent_advisor_is_recorded_not_re_asked() -> None:
    llm = _Canned({"advisors": [CROWD], "calls": [CALL]})
    spec = _spec("record")
    outcome = await Solver(llm, PromptBuilder(spec), Validator(spec), 3).solve([_inst()])
    (answer,) = outcome.answers
    assert answer.unheard == ["judge"] and len(llm.asked) == 1


async def test_a_request_wide_advisor_is_not_asked_again_on_a_re_ask() -> None:
    """Its one opinion is about the request: once recorded, re-asks go without it."""
    llm = _Canned(
        {"advisors": [CROWD, JUDGE], "calls": [CALL]},
        {"advisors": [JUDGE], "calls": [CALL]},
    )
    spec = _spec("record")
    two = [_inst(), Instance("b", {"text": "y"}, _inst().source, 10)]
    outcome = await Solver(llm, PromptBuilder(spec), Validator(spec), 3).solve(two)
    assert len(llm.asked) == 2 and len(outcome.answers) == 2
    first, again = (
        next(
            orjson.loads(m["content"])
            for m in asked
            if m["content"].startswith('{"activeAdvisors"')
        )
        for asked in llm.asked
    )
    assert first["activeAdvisors"] == ["judge", "crowd"] and again["activeAdvisors"] == ["judge"]
    assert all(any(o.advisor == "crowd" for o in a.opinions) for a in outcome.answers)


def test_a_request_wide_opinion_never_gates_one_item() -> None:
    spec = _spec()
    crowd = Opinion("crowd", None, {}, '{"reject": 100}')
    judge = Opinion("judge", "①", {}, '{"approve": 70}')
    _, everyone = summarise(spec, [crowd, judge])
    _, own = summarise(spec, [crowd, judge], instanced_only=True)
    assert set(everyone.distribution) == {"approve", "reject"}  # recorded with the rest
    assert own.option == "approve" and "reject" not in own.distribution


def test_the_gate_fails_closed_on_an_unheard_advisor_unless_the_spec_allows() -> None:
    spec = _spec()
    topics = Settings(bootstrap_servers="unused:9092").topics
    call = Call.model_validate({**CALL, "_instance": "a"})
    opinion = Opinion("crowd", None, {}, '{"approve": 100}')
    answer = Answer(_inst(), [call], "①", 1, 2, [opinion], unheard=["judge"])
    planned = RecordBuilder(LiveSpec(spec), topics, "m").batch("b", Outcome(answers=[answer]), None)
    assert {r.topic for r in planned.records} >= {topics.review}
    assert not any(r.topic == topics.activity("approve") for r in planned.records)
    allowed = spec.model_copy(
        update={"advice": spec.advice.model_copy(update={"missing": "allow"})}
    )
    planned = RecordBuilder(LiveSpec(allowed), topics, "m").batch(
        "b", Outcome(answers=[answer]), None
    )
    assert any(r.topic == topics.activity("approve") for r in planned.records)


def test_the_consult_question_is_recorded_in_the_advice_record() -> None:
    spec = _spec("record")
    topics = Settings(bootstrap_servers="unused:9092").topics
    call = Call.model_validate({**CALL, "_instance": "a"})
    opinion = Opinion("judge", "①", {}, '{"approve": 80}')
    answer = Answer(
        _inst(), [call], "①", 1, 2, [opinion], ["judge"], [("judge", "Is this a scam?")]
    )
    planned = RecordBuilder(LiveSpec(spec), topics, "m").batch("b", Outcome(answers=[answer]), None)
    (advice,) = [orjson.loads(r.value) for r in planned.records if r.topic == topics.advice]
    assert advice["questions"] == [{"advisor": "judge", "question": "Is this a scam?"}]
    assert advice["consulted"] == ["judge"]


def test_the_model_sees_each_advisor_s_weight() -> None:
    """#38 item 6: the model reconciles the votes (the seed), so it is told the weights."""
    spec = _spec()
    heavy = spec.advisors[0].model_copy(update={"weight": 2.5})
    spec = spec.model_copy(update={"advisors": [heavy, spec.advisors[1]]})
    system = PromptBuilder(spec).system
    block = next(p for p in system.split("\n\n") if p.startswith('[{"id":"judge"'))
    assert [a["weight"] for a in orjson.loads(block)] == [2.5, 1.0]
    assert "how much its votes count" in system
    # Static: two builders of the same spec give the same bytes (the cached prefix).
    assert PromptBuilder(spec).system == system


async def test_a_re_ask_shows_the_request_wide_opinion_it_does_not_ask_again() -> None:
    """#38 item 6: the re-asked instance is decided with the crowd's earlier opinion."""
    llm = _Canned(
        {"advisors": [{**CROWD, "calls": '{"reject": 70}'}, JUDGE], "calls": [CALL]},
        {"advisors": [JUDGE], "calls": [CALL]},
    )
    spec = _spec("record")
    two = [_inst(), Instance("b", {"text": "y"}, _inst().source, 10)]
    await Solver(llm, PromptBuilder(spec), Validator(spec), 3).solve(two)
    first, again = (orjson.loads(asked[2]["content"]) for asked in llm.asked)
    assert "heard" not in first  # a first ask is byte-identical to before
    assert again["activeAdvisors"] == ["judge"]
    assert again["heard"] == [{"id": "crowd", "calls": '{"reject": 70}'}]


def test_a_request_wide_advisor_gates_every_item_when_the_spec_says_so() -> None:
    """#38 item 6: the seed's riskAnalyst is request-wide; with `gates` its opinion holds
    each instance's call against it."""
    spec = _spec()
    crowd = spec.advisors[1].model_copy(update={"gates": True})
    spec = spec.model_copy(update={"advisors": [spec.advisors[0], crowd]})
    topics = Settings(bootstrap_servers="unused:9092").topics
    call = Call.model_validate({**CALL, "_instance": "a"})
    opinions = [
        Opinion("crowd", None, {}, '{"approve": 5, "reject": 95}'),
        Opinion("judge", "①", {}, "{}"),
    ]
    answer = Answer(_inst(), [call], "①", 1, 1, opinions)
    planned = RecordBuilder(LiveSpec(spec), topics, "m").batch("b", Outcome(answers=[answer]), None)
    assert any(r.topic == topics.review for r in planned.records)
    assert not any(r.topic == topics.activity("approve") for r in planned.records)
    ungated = _spec()  # the default: recorded, no gate on one item
    planned = RecordBuilder(LiveSpec(ungated), topics, "m").batch(
        "b", Outcome(answers=[answer]), None
    )
    assert any(r.topic == topics.activity("approve") for r in planned.records)
