from __future__ import annotations

import orjson
import pytest
from instanced_stream.core.messages import SourcePosition
from instanced_stream.core.spec import AgentSpec, load_spec
from instanced_stream.core.validate import Validator
from instanced_stream.errors import BadRecord
from instanced_stream.runtime.pipeline.intake import MAX_DEPTH, parse_item
from instanced_stream.settings import DEFAULT_SPEC

SRC = SourcePosition(topic="items", partition=1, offset=5)


def _answer(*calls: dict[str, object]) -> str:
    return orjson.dumps({"calls": list(calls)}).decode()


def test_valid_calls_are_accepted_per_token() -> None:
    v = Validator(load_spec(DEFAULT_SPEC))
    verdict = v.check(
        _answer(
            {"_tool": "moderateComment", "_instance": "①", "decision": "approve", "reason": "ok"},
            {"_tool": "NoAction", "_instance": "②", "reason": "nothing"},
        ),
        ["①", "②", "③"],
    )
    assert set(verdict.calls) == {"①", "②"}
    assert verdict.missing(["①", "②", "③"]) == ["③"]
    assert verdict.calls["①"][0].arguments == {"decision": "approve", "reason": "ok"}


@pytest.mark.parametrize(
    ("call", "code"),
    [
        ({"_tool": "dropTables", "_instance": "①"}, "unknown_tool"),
        (
            {"_tool": "moderateComment", "_instance": "⑨⑨", "decision": "approve", "reason": "x"},
            "unknown_instance",
        ),
        (
            {"_tool": "moderateComment", "_instance": "①", "decision": "maybe", "reason": "x"},
            "bad_arguments",
        ),
        ({"_tool": "moderateComment", "_instance": "①", "decision": "approve"}, "bad_arguments"),
        ("not an object", "malformed_call"),
    ],
)
def test_refused_calls(call: object, code: str) -> None:
    verdict = Validator(load_spec(DEFAULT_SPEC)).check(
        orjson.dumps({"calls": [call]}).decode(), ["①"]
    )
    assert [r.code for r in verdict.refusals] == [code]
    assert verdict.calls == {}


def test_malformed_answer_is_data_not_an_exception() -> None:
    v = Validator(load_spec(DEFAULT_SPEC))
    assert v.check("{'calls': oops", ["①"]).malformed
    assert v.check('{"advice": []}', ["①"]).malformed


def test_strict_nulls_for_optional_args_are_dropped_and_tool_named_args_stay_args() -> None:
    spec = AgentSpec.model_validate(
        {
            "name": "x",
            "instructions": "y",
            "tools": [
                {
                    "name": "route",
                    "description": "d",
                    "parameters": {
                        "type": "object",
                        "properties": {"tool": {"type": "string"}, "note": {"type": "string"}},
                        "required": ["tool"],
                        "additionalProperties": False,
                    },
                }
            ],
        }
    )
    verdict = Validator(spec).check(
        _answer({"_tool": "route", "_instance": "①", "tool": "hammer", "note": None}), ["①"]
    )
    call = verdict.calls["①"][0]
    assert call.tool == "route"
    assert call.arguments == {"tool": "hammer"}


@pytest.mark.parametrize(
    ("value", "key", "code"),
    [
        (b"{nope", b"k", "not_json"),
        (b"[1]", b"k", "not_object"),
        (b'{"comment": "x"}', None, "no_instance"),
        (b'{"_instance": "", "comment": "x"}', None, "no_instance"),
        (b'{"_instance": "a", "comment": "' + b"x" * 500 + b'"}', None, "too_large"),
        (None, b"k", "not_json"),
    ],
)
def test_bad_records_say_why(value: bytes | None, key: bytes | None, code: str) -> None:
    with pytest.raises(BadRecord) as err:
        parse_item(value, key, SRC, max_bytes=256)
    assert err.value.code == code


@pytest.mark.parametrize("depth", [MAX_DEPTH, MAX_DEPTH + 1, 300, 1000])
@pytest.mark.parametrize(("opening", "closing"), [(b"[", b"]"), (b'{"n": ', b"}")])
def test_nesting_deeper_than_the_limit_is_too_large(
    depth: int, opening: bytes, closing: bytes
) -> None:
    """orjson writes at most 254 levels: a deeper item would fail its batch's prompt."""
    inner = opening * (depth - 1) + b"0" + closing * (depth - 1)  # plus the record's own {}
    value = b'{"_instance": "d", "v": ' + inner + b"}"
    if depth <= MAX_DEPTH:
        inst = parse_item(value, None, SRC, 1_000_000)
        assert orjson.dumps([{"wrapped": [inst.payload]}])  # the prompt can still write it
        return
    with pytest.raises(BadRecord, match=f"more than {MAX_DEPTH} levels") as err:
        parse_item(value, None, SRC, 1_000_000)
    assert err.value.code == "too_large"


def test_many_brackets_in_strings_are_not_nesting() -> None:
    value = orjson.dumps({"_instance": "s", "text": "[" * 500 + "{" * 500})
    assert parse_item(value, None, SRC, 1_000_000).id == "s"


def test_instance_id_from_field_else_key() -> None:
    assert parse_item(b'{"_instance": "a-1", "c": 1}', b"key", SRC, 1000).id == "a-1"
    inst = parse_item(b'{"c": 1}', b"key-7", SRC, 1000)
    assert inst.id == "key-7"
    assert inst.payload == {"c": 1}


def test_an_instance_called_twice_in_contradiction_is_asked_again() -> None:
    """#26 item 5: the first call no longer wins (it may be one another item's text
    injected); neither is taken and the instance is asked again."""
    v = Validator(load_spec(DEFAULT_SPEC))
    approve: dict[str, object] = {
        "_tool": "moderateComment",
        "_instance": "①",
        "decision": "approve",
        "reason": "a",
    }
    reject: dict[str, object] = {
        "_tool": "moderateComment",
        "_instance": "①",
        "decision": "reject",
        "reason": "b",
    }
    verdict = v.check(_answer(approve, reject, dict(approve)), ["①"])
    assert "①" not in verdict.calls and verdict.missing(["①"]) == ["①"]
    assert [r.code for r in verdict.refusals] == ["duplicate_call"]
    assert verdict.refusals[0].call == reject
    assert verdict.duplicates == 1  # the word-for-word repeat is dropped, not refused


def test_an_answer_cut_off_keeps_its_complete_calls_and_drops_the_last() -> None:
    v = Validator(load_spec(DEFAULT_SPEC))
    whole = _answer(
        {"_tool": "moderateComment", "_instance": "①", "decision": "approve", "reason": "a"},
        {"_tool": "moderateComment", "_instance": "②", "decision": "reject", "reason": "b"},
        {"_tool": "moderateComment", "_instance": "③", "decision": "approve", "reason": "c"},
    )
    cut = whole[: whole.index('"③"') + 30]  # inside the third call's arguments
    verdict = v.check(cut, ["①", "②", "③"])
    assert verdict.cut_short and verdict.malformed is None
    assert set(verdict.calls) == {"①", "②"}  # ③ was cut short: dropped, asked again
    assert verdict.missing(["①", "②", "③"]) == ["③"]
    # Cut inside a string value: the partial call is not taken, even if it would parse.
    mid_reason = whole[: whole.index('"reason":"b"') + 10]
    assert set(v.check(mid_reason, ["①", "②", "③"]).calls) == {"①"}
    assert v.check("not json at all", ["①"]).malformed is not None


@pytest.mark.parametrize(
    ("record", "key", "kind", "context_key"),
    [
        ({"type": "plan", "mode": "lazy"}, b"k", "plan", "plan"),
        ({"type": "advisor", "id": "brandGuardian", "role": "r"}, None, "advisor", "brandGuardian"),
        ({"kind": "advisor", "id": "a1", "role": "r"}, b"k", "advisor", "a1"),
        ({"type": "tool", "name": "think", "kind": "latent"}, None, "tool", "think"),
        ({"type": "input", "instruction": "all hands"}, None, "input", "input@items/1/5"),
        ({"type": "input", "name": "season", "note": "busy"}, None, "input", "season"),
    ],
)
def test_a_context_kind_on_the_input_topic_is_no_item(
    record: dict[str, object], key: bytes | None, kind: str, context_key: str
) -> None:
    with pytest.raises(BadRecord) as err:
        parse_item(orjson.dumps(record), key, SRC, 4096, context_topic="t.context")
    assert err.value.code == "context_on_input"
    assert f"type: {kind}" in err.value.message and "t.context" in err.value.message
    assert "accept_context_input" in err.value.message
    assert err.value.data["context_key"] == context_key and err.value.data["forwardable"]
    assert orjson.loads(err.value.data["json"]) == record


def test_an_instanced_plan_on_the_input_topic_cannot_be_forwarded() -> None:
    value = orjson.dumps({"type": "plan", "_instance": "a", "mode": "lazy"})
    with pytest.raises(BadRecord, match="a plan is global") as err:
        parse_item(value, None, SRC, 4096)
    assert err.value.code == "context_on_input" and not err.value.data["forwardable"]


@pytest.mark.parametrize(
    ("record", "key"),
    [
        ({"type": "input", "_instance": "a", "c": 1}, None),  # an instance's input
        ({"type": "input", "c": 1}, b"a"),  # keyed: the key's instance
        ({"type": "comment", "c": 1}, b"a"),  # a data field named type
        ({"kind": "bug", "_instance": "a"}, None),  # a data field named kind
    ],
)
def test_a_record_without_a_context_kind_stays_an_item(
    record: dict[str, object], key: bytes | None
) -> None:
    assert parse_item(orjson.dumps(record), key, SRC, 4096).id == "a"


def test_a_keyless_record_that_declares_no_kind_is_still_no_instance() -> None:
    with pytest.raises(BadRecord) as err:
        parse_item(b'{"comment": "x"}', None, SRC, 4096)
    assert err.value.code == "no_instance"
