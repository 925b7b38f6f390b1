from __future__ import annotations

import orjson
from instanced_stream.core.instance import Instance
from instanced_stream.core.prompt import PromptBuilder
from instanced_stream.core.spec import load_spec
from instanced_stream.core.validate import Validator
from instanced_stream.settings import DEFAULT_SPEC
from instanced_stream_bench.testing.sim.account import SimConfig
from instanced_stream_bench.testing.sim.judge import plan_order
from instanced_stream_bench.testing.sim.planner import ORDERS
from instanced_stream_bench.testing.sim.request import read_request
from instanced_stream_bench.testing.sim.server import Simulator
from jsonschema import Draft202012Validator

from tests.fakes import make_batch
from tests.flows import tickets_spec


def _batch(texts: list[str]) -> list[Instance]:
    return make_batch(texts, "p")


def test_simulator_answer_fits_the_strict_schema_and_judges_with_the_classifier() -> None:
    spec = load_spec(DEFAULT_SPEC)
    builder = PromptBuilder(spec)
    texts = ["Thanks, very helpful!", "You are a fucking idiot.", "BUY NOW www.spam.test"]
    messages = builder.messages(_batch(texts))
    answer = Simulator().answer(read_request(messages))
    schema = builder.response_format(3)["json_schema"]["schema"]
    assert list(Draft202012Validator(schema).iter_errors(orjson.loads(answer))) == []
    verdict = Validator(spec).check(answer, ["①", "②", "③"])
    decisions = {t: c[0].arguments["decision"] for t, c in verdict.calls.items()}
    assert decisions == {"①": "approve", "②": "reject", "③": "reject"}
    notified = {
        t for t, calls in verdict.calls.items() if any(c.tool == "notifyAuthor" for c in calls)
    }
    assert notified == {"②", "③"}


def test_json_object_mode_uses_the_same_validation() -> None:
    spec = load_spec(DEFAULT_SPEC)
    spec = spec.model_copy(
        update={"model": spec.model.model_copy(update={"structured_output": "json_object"})}
    )
    builder = PromptBuilder(spec)
    assert builder.response_format(2) == {"type": "json_object"}
    req = read_request(builder.messages(_batch(["ok", "fine"])))
    verdict = Validator(spec).check(Simulator().answer(req), ["①", "②"])
    assert set(verdict.calls) == {"①", "②"}
    assert not verdict.refusals


def test_the_simulator_writes_plans_in_the_order_a_request_chose() -> None:
    """#45: readers first (pageOnCall before the assessUrgency it reads), in the compact
    form too; under `mixed` the order follows the request, and requests get every order."""

    spec = tickets_spec()
    builder = PromptBuilder(spec)
    batch = [
        Instance("t1", {"subject": "site down", "body": "b"}, make_batch(["x"], "p")[0].source, 40)
    ]
    req = read_request(builder.messages(batch))
    sim = Simulator(SimConfig(plan_order="readers_first"))
    verdict = Validator(spec).check(sim.answer(req), ["①"], states={"①": {}})
    tools = [c.tool for c in verdict.calls["①"]]
    assert tools.index("pageOnCall") < tools.index("assessUrgency")
    sim = Simulator(SimConfig(plan_order="producers_first"))
    tools = [c.tool for c in Validator(spec).check(sim.answer(req), ["①"]).calls["①"]]
    assert tools.index("pageOnCall") > tools.index("assessUrgency")
    chosen = {
        plan_order(SimConfig(), read_request(builder.messages(make_batch([f"t {k}"], "p"))))
        for k in range(30)
    }
    assert chosen == set(ORDERS)


def test_the_answers_tokens_are_counted_by_the_advisor_that_wrote_them() -> None:
    from instanced_stream.core.tokenizer import estimate_tokens
    from instanced_stream_bench.testing.sim.server import answer_parts

    spec = load_spec(DEFAULT_SPEC)
    messages = PromptBuilder(spec).messages(_batch(["Thanks!", "You idiot.", "Nice one"]))
    answer = Simulator().answer(read_request(messages))
    parts = answer_parts(answer)
    opinions = orjson.loads(answer)["advisors"]
    mine = [o for o in opinions if o["id"] == "safetyOfficer"]
    assert len(mine) == 3  # instanced: one opinion per comment
    assert parts["answer_tokens:safetyOfficer"] == sum(
        estimate_tokens(orjson.dumps(o).decode()) for o in mine
    )
    assert parts["answer_tokens:communityManager"] > 0  # request-wide: once
    assert sum(parts.values()) == estimate_tokens(answer)  # the calls take the rest
    assert answer_parts("not json at all") == {
        "answer_tokens:calls": estimate_tokens("not json at all")
    }
