"""The keyed answer form: every instance's key required, at least one call each, no other
key; the same schema for every window of a size; read back into protocol calls."""

from __future__ import annotations

from typing import Any

from instanced_stream.core.prompt import PromptBuilder
from instanced_stream.core.solve import Solver
from instanced_stream.core.spec import AgentSpec, load_spec
from instanced_stream.core.validate import Validator
from instanced_stream.llm.strict import violations
from instanced_stream.settings import EXAMPLES
from instanced_stream_bench.testing.sim.account import Faults, SimConfig
from instanced_stream_bench.testing.sim.server import Simulator
from jsonschema import Draft202012Validator

from tests.fakes import FakeLLM, make_batch


def _spec(example: str = "seed_moderation") -> AgentSpec:
    spec = load_spec(EXAMPLES / example / "agent.yaml")
    return spec.model_copy(update={"model": spec.model.model_copy(update={"answer": "keyed"})})


def _schema(spec: AgentSpec, n: int) -> dict[str, Any]:
    schema: dict[str, Any] = PromptBuilder(spec).response_format(n)["json_schema"]["schema"]
    return schema


def test_every_key_is_required_once_with_a_call_and_nothing_else() -> None:
    spec = _spec()
    schema = _schema(spec, 3)
    assert violations(schema) == []
    calls = schema["properties"]["calls"]
    assert calls["required"] == ["1", "2", "3"] and calls["additionalProperties"] is False
    assert all(v["minItems"] == 1 for v in calls["properties"].values())
    check = Draft202012Validator(schema)
    call = {"_tool": "moderateComment", "_scopes": None, "decision": "approve"}
    assert check.is_valid({"calls": {"1": [call], "2": [call], "3": [call]}})
    assert not check.is_valid({"calls": {"1": [call], "3": [call]}})  # a skipped instance
    assert not check.is_valid({"calls": {"1": [call], "2": [], "3": [call]}})  # no call
    extra = {"1": [call], "2": [call], "3": [call], "4": [call]}
    assert not check.is_valid({"calls": extra})  # an invented instance
    assert _schema(spec, 3) == schema  # positional: the same for every window of 3


def test_the_council_example_is_strict_too() -> None:
    spec = _spec("moderation")
    for n in (1, 25, 100):
        assert violations(_schema(spec, n)) == []


async def test_answers_read_back_into_protocol_calls_and_skips_are_asked_again() -> None:
    spec = _spec()
    sim = Simulator(SimConfig(classifier=False, seed=3, faults=Faults(skip_rate=0.2)))
    llm = FakeLLM(sim)
    solver = Solver(llm, PromptBuilder(spec), Validator(spec), 4)
    batch = make_batch([f"comment {k} is {'stupid' if k % 2 else 'fine'}" for k in range(10)])
    out = await solver.solve(batch)
    assert len({id(a.instance) for a in out.answers}) == 10 and not out.unanswered
    decisions = {a.instance.id: a.calls[0].arguments["decision"] for a in out.answers}
    assert decisions["id-1"] == "reject" and decisions["id-0"] == "approve"
    assert '"1":[{' in llm.sim.answer(llm.asks[0]).replace(" ", "")  # keyed on the wire


def test_an_invented_key_is_refused_as_an_unknown_instance() -> None:
    spec = _spec()
    tokens = ["①", "②"]
    call = {"_tool": "moderateComment", "decision": "approve"}
    verdict = Validator(spec).check(
        '{"calls": {"1": [%s], "2": [%s], "7": [%s]}}' % ((str(call).replace("'", '"'),) * 3),
        tokens,
    )
    assert set(verdict.calls) == {"①", "②"}
    assert [r.code for r in verdict.refusals] == ["unknown_instance"]
