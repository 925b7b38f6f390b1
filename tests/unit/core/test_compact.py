"""The compact answer round trip: what the model writes (calls grouped per tool, each a
positional array) becomes the same protocol calls the verbose form gives, refused per call."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from instanced_stream.core.compact import compress, expand
from instanced_stream.core.prompt import PromptBuilder
from instanced_stream.core.spec import AgentSpec, load_spec
from instanced_stream.core.validate import Validator
from instanced_stream.settings import DEFAULT_SPEC
from jsonschema import Draft202012Validator

TOKENS = ["①", "②", "③", "④"]


def _spec(reasoning: str = "full", paths: bool = False) -> AgentSpec:
    tools: list[dict[str, Any]] = [
        {
            "name": "moderateComment",
            "description": "d",
            "parameters": {
                "type": "object",
                "properties": {
                    "decision": {"type": "string", "enum": ["approve", "reject"]},
                    "reason": {"type": "string"},
                    "severity": {"type": "integer"},  # optional: null in the compact call
                },
                "required": ["decision", "reason"],
                "additionalProperties": False,
            },
        },
        {
            "name": "notifyAuthor",
            "description": "d",
            "parameters": {
                "type": "object",
                "properties": {"message": {"type": "string"}},
                "required": ["message"],
                "additionalProperties": False,
            },
            **({"paths": ["†state.notified"]} if paths else {}),
        },
    ]
    return AgentSpec.model_validate(
        {
            "name": "t",
            "instructions": "i",
            "tools": tools,
            "model": {"reasoning": reasoning},
            # awaited calls need a plan (no plan: one-shot and stateless)
            **({"plan": {"mode": "eager"}} if paths else {}),
        }
    )


def _protocol_calls(reasoning: bool, stateful: bool) -> list[dict[str, Any]]:
    why = {"_reasoningForCall": "why"} if reasoning else {}
    meta = {"_outputPath": None, "_scopes": None} if stateful else {}
    # Activities may import their instance's input in any spec (null: nothing).
    scoped = meta or {"_scopes": None}
    out: list[dict[str, Any]] = []
    for k, token in enumerate(TOKENS):
        reject = k % 2 == 0
        out.append(
            {
                "_tool": "moderateComment",
                "_instance": token,
                **({"_reasoningForCall": f"score {k}"} if reasoning else {}),
                **scoped,
                "decision": "reject" if reject else "approve",
                "reason": "rude" if reject else "fine",
                "severity": 3 if k == 0 else None,
            }
        )
    for token in ("①", "③"):
        extra = {"_outputPath": "†state.notified", "_scopes": ["input"]} if stateful else {}
        out.append(
            {"_tool": "notifyAuthor", "_instance": token, **why, **scoped, **extra, "message": "m"}
        )
    out.append({"_tool": "NoAction", "_instance": "④", **why, **meta, "reason": "nothing"})
    return out


@pytest.mark.parametrize("reasoning", ["full", "off"])
@pytest.mark.parametrize("stateful", [False, True])
def test_every_instance_tool_and_argument_survives_the_round_trip(
    reasoning: str, stateful: bool
) -> None:
    builder = PromptBuilder(_spec(reasoning, paths=stateful))
    calls = _protocol_calls(reasoning != "off", stateful)
    if reasoning == "off":  # NoAction takes no reason when reasoning is off
        calls = [
            {k: v for k, v in c.items() if k != "reason" or c["_tool"] != "NoAction"} for c in calls
        ]
    # The model reads instances by number (① is 1) and writes them so.
    numbered = [{**c, "_instance": TOKENS.index(c["_instance"]) + 1} for c in calls]
    packed = compress(numbered, builder.call_fields)
    assert list(packed) == ["moderateComment", "notifyAuthor", "NoAction"]
    schema = builder.response_format(len(TOKENS))["json_schema"]["schema"]
    assert list(Draft202012Validator(schema).iter_errors({"calls": packed})) == []
    back = expand(packed, builder.call_fields, TOKENS)
    key = lambda c: (c["_tool"], c["_instance"])  # noqa: E731
    assert sorted(back, key=key) == sorted(calls, key=key)


def test_same_calls_share_one_entry_and_an_empty_reasoning_repeats_the_previous() -> None:
    builder = PromptBuilder(_spec("full"))
    calls = [
        {
            "_tool": "moderateComment",
            "_instance": t,
            "_reasoningForCall": "clean",
            "_scopes": None,
            "decision": "approve",
            "reason": "fine",
            "severity": None,
        }
        for t in ("①", "②")
    ] + [
        {
            "_tool": "moderateComment",
            "_instance": "③",
            "_reasoningForCall": "insult",
            "_scopes": None,
            "decision": "reject",
            "reason": "rude",
            "severity": None,
        },
        {
            "_tool": "notifyAuthor",
            "_instance": "③",
            "_reasoningForCall": "insult",
            "_scopes": None,
            "message": "m",
        },
    ]
    packed = compress(calls, builder.call_fields)
    assert packed["moderateComment"][0] == [["①", "②"], "clean", None, "approve", "fine", None]
    assert packed["notifyAuthor"] == [["③", "", None, "m"]]  # said once, for the first call
    assert sorted(orjson.dumps(c) for c in expand(packed, builder.call_fields)) == sorted(
        orjson.dumps(c) for c in calls
    )


def test_validator_refuses_compact_calls_one_by_one() -> None:
    spec = _spec("off")
    answer = {
        "calls": {
            "moderateComment": [
                [[1, 9], None, "approve", "fine", None],  # 9 is no instance of this batch
                [2, None, "maybe", "hm", None],  # not an allowed decision
                [3, "reject"],  # too few values
            ],
            "notifyAuthor": [[3, None, "m"]],
            "dropTables": [[4]],
            "NoAction": [[4]],
        }
    }
    verdict = Validator(spec).check(orjson.dumps(answer).decode(), TOKENS)
    assert {t: [c.tool for c in calls] for t, calls in verdict.calls.items()} == {
        "①": ["moderateComment"],
        "③": ["notifyAuthor"],
        "④": ["NoAction"],
    }
    assert verdict.calls["①"][0].arguments == {"decision": "approve", "reason": "fine"}
    codes = sorted((r.code, r.token) for r in verdict.refusals)
    assert codes == [
        ("bad_arguments", "②"),
        ("malformed_call", "③"),
        ("unknown_instance", None),
        ("unknown_tool", "④"),
    ]
    assert verdict.missing(TOKENS) == ["②"]


def test_a_cut_compact_answer_keeps_its_complete_calls() -> None:
    spec = load_spec(DEFAULT_SPEC)
    text = (
        '{"advisors":[],"calls":{"moderateComment":[[1,"w",null,"approve","fine"],[2,"w",null,"ru'
    )
    verdict = Validator(spec).check(text, ["①", "②"])
    assert verdict.cut_short
    assert set(verdict.calls) == {"①"}
    assert verdict.calls["①"][0].reasoning == "w"


def test_remembered_argument_verdicts_belong_to_their_own_arguments() -> None:
    validator = Validator(_spec("off"))
    answer = {
        "calls": {
            "moderateComment": [
                [[1, 2], None, "approve", "fine", None],
                [3, None, "maybe", "fine", None],
            ],
            "notifyAuthor": [],
            "NoAction": [[4]],
        }
    }
    for _ in range(2):  # the second time from the remembered verdicts: the same outcome
        verdict = validator.check(orjson.dumps(answer).decode(), TOKENS)
        assert sorted(verdict.calls) == ["①", "②", "④"]
        assert [(r.code, r.token) for r in verdict.refusals] == [("bad_arguments", "③")]
        assert "decision" in verdict.refusals[0].reason
