"""The seeds' protocol rules that need no broker: registration as the seeds write it, the
seed's own advisor response, output paths, scopes, `on` per turn, input precedence."""

from __future__ import annotations

import math
from typing import Any

import orjson
import pytest
from instanced_stream.core.advice import summarise
from instanced_stream.core.instance import Instance
from instanced_stream.core.live_spec import LiveSpec
from instanced_stream.core.messages import SourcePosition
from instanced_stream.core.model import Completion
from instanced_stream.core.prompt import Ask, PromptBuilder
from instanced_stream.core.solve import Solver
from instanced_stream.core.spec import AgentSpec, load_spec
from instanced_stream.core.validate import Validator, output_path_problem, scopes_problem
from instanced_stream.runtime.pipeline.intake import parse_item
from instanced_stream.runtime.pipeline.outcomes.scopes import imported
from instanced_stream.runtime.pipeline.windows.twins import Twins
from instanced_stream.settings import EXAMPLES
from instanced_stream_bench.harness.seeds import seed_items

# The Advisor seed (Russian text), verbatim: registration and the model's response.
SEED_ADVISOR: dict[str, Any] = {
    "type": "advisor",
    "id": "аналитикРисков",
    "on": "request",
    "scopes": ["†state.deploymentHistory"],
    "role": "Анализировать риски и голосовать за действия по развёртыванию.",
    "schema": {
        "type": "object",
        "properties": {
            "thought": {"type": "string", "description": "Оценка рисков развёртывания."}
        },
        "required": ["thought"],
    },
}
SEED_RESPONSE = """{
  "advisors": [
    {
      "id": "аналитикРисков",
      "thought": "Новая функция прошла простые тесты, но не комплексные.",
      "calls": "{\\"deploy\\": 10, \\"rollback\\": 5, \\"delay\\": 95}"
    }
  ],
  "calls": [
    {
      "_tool": "delay",
      "_reasoningForCall": "Аналитик рисков настоятельно советует отложить."
    }
  ]
}"""
SOURCE = SourcePosition(topic="in", partition=0, offset=7)


def _spec(**extra: Any) -> AgentSpec:
    tools = [{"name": n, "description": n} for n in ("deploy", "rollback", "delay")]
    return AgentSpec.model_validate(
        {"name": "seed", "instructions": "decide", "tools": tools, **extra}
    )


@pytest.mark.parametrize("field", ["type", "kind"])
def test_the_seeds_advisor_registers_with_kind_or_type_and_a_cyrillic_id(field: str) -> None:
    advisor = {field: "advisor", **{k: v for k, v in SEED_ADVISOR.items() if k != "type"}}
    spec = _spec(advisors=[advisor])
    assert spec.advisors[0].id == "аналитикРисков" and spec.advisors[0].on == "request"


def test_the_seeds_advisor_response_parses_validates_and_keeps_its_scores() -> None:
    spec = _spec(advisors=[SEED_ADVISOR])
    verdict = Validator(spec).check(SEED_RESPONSE, ["①"], Ask(("аналитикРисков",)))
    assert not verdict.refusals and verdict.malformed is None
    [call] = verdict.calls["①"]  # a one-instance request: the call can mean only ①
    assert call.tool == "delay" and call.reasoning
    records, consensus = summarise(spec, verdict.opinions)
    assert records[0].votes == {"deploy": 0.1, "rollback": 0.05, "delay": 0.95}
    assert consensus.option == "delay" and math.isclose(consensus.score, 0.95)


def test_a_call_without_instance_is_refused_when_the_request_has_several() -> None:
    verdict = Validator(_spec()).check('{"calls": [{"_tool": "delay"}]}', ["①", "②"])
    assert [r.code for r in verdict.refusals] == ["unknown_instance"]


def test_output_paths_must_be_state_paths_the_tool_declares() -> None:
    spec = AgentSpec.model_validate(
        {
            "name": "p",
            "instructions": "x",
            "plan": {"mode": "eager"},
            "tools": [
                {"name": "look", "description": "d", "paths": ["†state.a", "†state.b"]},
                {"name": "free", "description": "d", "output": {"type": "object"}},
                {"name": "note", "description": "d", "kind": "latent"},
                {"name": "fire", "description": "d"},
            ],
        }
    )
    look, free, note, fire = spec.tools
    assert output_path_problem(look, "†state.a || †state.b") is None
    assert output_path_problem(free, "†state.anything.deep") is None
    assert output_path_problem(note, "†state.anything") is None
    # latent: its branch collapses to one path as the model writes it (plan_graph.collapse)
    assert output_path_problem(note, "†state.x || †state.y") is None
    for tool, path in [
        (look, "state.a"),
        (look, "†state.c"),
        (free, "†stateful"),
        (free, "†state..x"),
        (free, "†state.a ||"),
        (fire, "†state.x"),  # neither paths nor _output: fire-and-forget
    ]:
        assert output_path_problem(tool, path), (tool.name, path)


def test_scopes_resolve_or_are_refused() -> None:
    assert scopes_problem(["input", "input.comment", "†state", "†state.customer.plan"]) is None
    for bad in [["inputs"], ["state"], ["input."], ["†state.a..b"], "input", [1]]:
        assert scopes_problem(bad), bad


def test_on_modes_per_turn() -> None:
    advisors = [
        {"id": i, "role": i, "on": on}
        for i, on in [("opener", "start"), ("monitor", "request"), ("closer", "finish")]
    ] + [{"id": "legal", "role": "legal", "on": None}]
    planned = PromptBuilder(_spec(advisors=advisors, plan={"maxTurns": 3}))
    # #38 item 6: a workflow can end on its first turn: the finish advisor speaks there.
    assert planned.ask_for(1) == Ask(("opener", "monitor", "closer"), True)
    assert planned.ask_for(2) == Ask(("monitor", "closer"), True)
    assert planned.ask_for(3) == Ask(("monitor", "closer"), True)
    # The loop reads the finish advisor's "stop": the model is told the options.
    assert '"stop" and "continue"' in planned.system
    # Without a plan the one request is both the start and the end.
    single = PromptBuilder(_spec(advisors=advisors))
    assert single.ask_for(1).active == ("opener", "monitor", "closer")


def test_shown_ids_and_consult_questions_reach_the_request() -> None:
    # The protocol form's tokens (the compact form numbers instances instead).
    spec = _spec(
        instance_ids="shown",
        advisors=[{**SEED_ADVISOR, "on": None}],
        model={"name": "m", "answer": "protocol"},
    )
    inst = Instance("employee_B", {"type": "state", "task": "t"}, SOURCE, 10)
    messages = PromptBuilder(spec).messages(
        [inst], Ask(("аналитикРисков",)), questions=[("①", "аналитикРисков", "Safe now?")]
    )
    body = orjson.loads(messages[1]["content"])
    assert body[0]["_instance"] == "①" and body[0]["_id"] == "employee_B"
    control = orjson.loads(messages[2]["content"])
    assert control["questions"] == [
        {"_instance": "①", "advisor": "аналитикРисков", "question": "Safe now?"}
    ]
    hidden = PromptBuilder(_spec()).messages([inst])
    assert "employee_B" not in hidden[1]["content"]


def test_an_instance_input_overrides_the_global_one_in_its_scopes() -> None:
    spec = _spec(inputs=[{"type": "input", "language": "en", "region": "eu"}])
    inst = Instance("c-1", {"type": "input", "language": "fr", "text": "salut"}, SOURCE, 10)
    [merged] = imported(spec, inst, ["input"], {})
    assert merged["language"] == "fr" and merged["region"] == "eu" and merged["_instance"] == "c-1"
    picked = imported(spec, inst, ["input.region", "input.language"], {})
    assert [(p["scope"], p.get("region", p.get("language"))) for p in picked] == [
        ("input.region", "eu"),
        ("input.language", "fr"),
    ]


def test_the_instancing_seed_s_manager_answer_names_a_shown_id() -> None:
    """#38 item 7: with `instance_ids: shown`, the seed's literal `"_instance":
    "employee_B"` is that instance's call; a hidden spec still takes tokens only."""
    answer = (
        '{"calls": [{"_tool": "delay", "_instance": "employee_B"},'
        ' {"_tool": "deploy", "_instance": "employee_C"}]}'
    )
    names = {"employee_A": "①", "employee_B": "②"}
    shown = Validator(_spec(instance_ids="shown")).check(answer, ["①", "②"], names=names)
    assert [c.tool for c in shown.calls["②"]] == ["delay"] and "①" not in shown.calls
    # An id that is not in the request is still unknown.
    assert [r.code for r in shown.refusals] == ["unknown_instance"]
    hidden = Validator(_spec()).check(answer, ["①", "②"], names=names)
    assert not hidden.calls and [r.code for r in hidden.refusals] == ["unknown_instance"] * 2


def test_the_seed_s_hundred_comments_are_a_hundred_instances_of_one_request() -> None:
    """The Instancing seed's point: 100 comments in ONE request. With dedupe on by default
    (a spec without a plan), twins among the demo's comments would be asked once and the
    request would hold fewer (61 of 100 before the comments were made distinct)."""
    spec = load_spec(EXAMPLES / "seeds" / "moderation.yaml")
    assert spec.window.max_items == 100 and spec.dedupe.enabled
    items = [
        parse_item(
            orjson.dumps(item), None, SourcePosition(topic="in", partition=0, offset=k), 4096
        )
        for k, item in enumerate(seed_items("moderation"))
    ]
    split = Twins(LiveSpec(spec)).split(items)
    assert len(items) == 100 and len(split.asked) == 100 and split.asked == items


# The Instancing seed's manager answer, verbatim (its "Целевое Решение").
SEED_MANAGER_ANSWER = """{
  "calls": [
    {
      "_tool": "updateTask",
      "_instance": "employee_B",
      "newTask": "Finalize the quarterly report",
      "newStatus": "High Priority",
      "output": "†state"
    }
  ]
}"""


def test_the_seed_s_output_spelling_is_read_as_the_output_path_never_an_argument() -> None:
    """#45 item 3: the manager seed's `"output": "†state"`, in the example's own spec."""
    spec = load_spec(EXAMPLES / "seeds" / "manager.yaml")
    names = {"employee_A": "①", "employee_B": "②"}
    verdict = Validator(spec).check(SEED_MANAGER_ANSWER, ["①", "②"], names=names)
    assert not verdict.refusals
    (call,) = verdict.calls["②"]
    assert call.output_path == "†state" and "output" not in call.arguments
    assert call.arguments == {
        "newTask": "Finalize the quarterly report",
        "newStatus": "High Priority",
    }
    # Not a path, on a tool without such an argument: refused with why, not kept.
    wrong = SEED_MANAGER_ANSWER.replace('"output": "†state"', '"output": "the state"')
    refused = Validator(spec).check(wrong, ["①", "②"], names=names)
    assert not refused.calls and [r.code for r in refused.refusals] == ["bad_output_path"]
    assert '"output"' in refused.refusals[0].reason


def test_an_opinion_that_breaks_its_advisor_s_schema_is_marked() -> None:
    """The seed's advisor schema requires `thought`: an opinion without it is recorded
    with the error (and counts for nothing), one with it has none."""
    spec = _spec(advisors=[SEED_ADVISOR])
    good = Validator(spec).check(SEED_RESPONSE, ["①"], Ask(("аналитикРисков",)))
    assert [o.error for o in good.opinions] == [None]
    bare = SEED_RESPONSE.replace(
        '"thought": "Новая функция прошла простые тесты, но не комплексные.",', ""
    )
    bad = Validator(spec).check(bare, ["①"], Ask(("аналитикРисков",)))
    (opinion,) = bad.opinions
    assert opinion.error is not None and "thought" in opinion.error
    _, consensus = summarise(spec, bad.opinions)
    assert consensus.option != "delay" or consensus.score == 0


def test_two_advisors_with_one_id_are_refused_at_load() -> None:
    with pytest.raises(ValueError, match="advisor ids must be unique"):
        _spec(advisors=[SEED_ADVISOR, {**SEED_ADVISOR, "role": "another"}])


def test_the_consult_call_carries_the_model_s_question() -> None:
    spec = _spec(advisors=[{**SEED_ADVISOR, "on": None}])
    answer = (
        '{"calls": [{"_tool": "ConsultAdvisor", "_instance": "①",'
        ' "advisor": "аналитикРисков", "question": "Is a rollback likely?"}]}'
    )
    verdict = Validator(spec).check(answer, ["①"], Ask((), True))
    assert verdict.consults == {"①": [("аналитикРисков", "Is a rollback likely?")]}


class _Canned:
    """Answers every request with the one text (the seed's answer)."""

    model = "canned"

    def __init__(self, text: str) -> None:
        self.text = text
        self.asked = 0

    async def complete(
        self, messages: list[dict[str, str]], response_format: dict[str, Any], **_: Any
    ) -> Completion:
        self.asked += 1
        return Completion(self.text, "stop", 10, 5, 0, 0.01)

    async def close(self) -> None:
        return None


async def test_the_seed_s_silent_employee_ends_in_no_action_without_a_re_ask() -> None:
    """`silence: no_action` (the manager seed leaves employee_A without a call): one
    request; employee_A's outcome is a NoAction saying why, employee_B has its update."""
    spec = load_spec(EXAMPLES / "seeds" / "manager.yaml")
    employees = [
        Instance(e["_instance"], e, SOURCE, 40, {k: v for k, v in e.items() if k != "type"})
        for e in seed_items("manager")
    ]
    llm = _Canned(SEED_MANAGER_ANSWER)
    out = await Solver(llm, PromptBuilder(spec), Validator(spec), 3).solve(employees)
    assert llm.asked == 1 and not out.unanswered
    calls = {a.instance.id: [c.tool for c in a.calls] for a in out.answers}
    assert calls == {"employee_A": ["NoAction"], "employee_B": ["updateTask"]}
