"""Every schema the product sends with `strict: true` is inside OpenAI's documented
subset for Structured Outputs (the rules: `stream/instanced_stream/llm/strict.py`, written from the
provider's documentation, and pinned below by the documentation's own cases)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from instanced_stream.core.prompt import Ask, PromptBuilder
from instanced_stream.core.spec import AgentSpec, load_spec
from instanced_stream.core.strict_form import strict_form, without_nulls
from instanced_stream.llm.factory import initial_shape
from instanced_stream.llm.strict import violations
from jsonschema import Draft202012Validator

EXAMPLES = sorted((Path(__file__).resolve().parents[3] / "examples").glob("*/*.yaml"))


def _asks(prompt: PromptBuilder) -> list[Ask]:
    """Every set of speaking advisors a run can ask with: each turn's, consulted ones."""
    spec = prompt.spec
    turns = range(1, (spec.plan.max_turns if spec.plan else 1) + 1)
    asks = {prompt.ask_for(t) for t in turns}
    every = tuple(a.id for a in spec.advisors)
    asks |= {Ask(every, bool(spec.on_demand)), Ask(every, False), Ask((), False)}
    return sorted(asks, key=repr)


def _strict_schemas(spec: AgentSpec) -> list[dict[str, Any]]:
    out = []
    for answer in ("compact", "protocol", "keyed"):
        for bounded in (True, False):
            model = spec.model.model_copy(
                update={
                    "answer": answer,
                    "bounded_answer": bounded,
                    "structured_output": "json_schema",  # what it would send in that mode
                }
            )
            prompt = PromptBuilder(spec.model_copy(update={"model": model}))
            for ask in _asks(prompt):
                for n in (1, 2, 25, 100):
                    fmt = prompt.response_format(n, ask)
                    assert fmt["json_schema"]["strict"] is True
                    out.append(fmt["json_schema"]["schema"])
    return out


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_shipped_example_sends_a_schema_strict_mode_accepts(path: Path) -> None:
    spec = load_spec(path)
    for schema in _strict_schemas(spec):
        assert violations(schema) == []
    # The seeds' manager example asks json_object on purpose: the seed's own answer
    # spells the output path "output", which a strict schema would not let a model write.
    expect = (
        "json_object" if spec.model.structured_output == "json_object" else "json_schema_strict"
    )
    assert initial_shape(spec).response_format == expect


def _rich_tool_spec() -> AgentSpec:
    """A tool as users write them: nested objects, optional fields, long enums, and
    keywords strict mode does not know (a length limit, a default, unique items)."""
    base = load_spec(EXAMPLES[0]).model_dump(by_alias=True, exclude_none=True)
    countries = [f"C{k:03d}" for k in range(400)]
    base["tools"] = [
        {
            "name": "fileReport",
            "description": "File a structured report.",
            "parameters": {
                "type": "object",
                "properties": {
                    "summary": {"type": "string", "maxLength": 200, "minLength": 3},
                    "country": {"type": "string", "enum": countries},
                    "severity": {"type": "integer", "minimum": 1, "maximum": 5, "default": 3},
                    "tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
                    "contact": {
                        "type": "object",
                        "properties": {
                            "name": {"type": "string"},
                            "email": {"type": "string", "format": "email"},
                            "address": {
                                "type": "object",
                                "properties": {
                                    "city": {"type": "string"},
                                    "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
                                },
                                "required": ["city"],
                            },
                        },
                        "required": ["name"],
                    },
                    "kind": {
                        "oneOf": [
                            {"type": "string", "enum": ["bug", "abuse"]},
                            {"type": "null"},
                        ]
                    },
                },
                "required": ["summary", "country"],
            },
        }
    ]
    return AgentSpec.model_validate(base)


def test_a_rich_user_tool_is_made_strict_and_its_answers_still_validate() -> None:
    spec = _rich_tool_spec()
    for schema in _strict_schemas(spec):
        assert violations(schema) == []
    # What strict mode makes the model write (optional fields as null, at every depth)
    # is read back in the tool's own terms, and the dropped keywords still hold.
    tool = spec.tools[0]
    answer = {
        "summary": "broken login",
        "country": "C007",
        "severity": None,
        "tags": None,
        "contact": {"name": "Ann", "email": None, "address": {"city": "X", "zip": None}},
        "kind": None,
    }
    args = {k: without_nulls(v, tool.parameters["properties"][k]) for k, v in answer.items()}
    args = {k: v for k, v in args.items() if v is not None or k in ("kind",)}
    assert args["contact"] == {"name": "Ann", "address": {"city": "X"}}
    # The validator checks answers against the tool's schema as written, where the
    # keywords strict mode could not carry still hold.
    assert Draft202012Validator(tool.parameters).is_valid(args)
    assert not Draft202012Validator(tool.parameters).is_valid({**args, "summary": "no"})


def test_a_schema_that_cannot_be_strict_starts_non_strict_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    base = load_spec(EXAMPLES[0]).model_dump(by_alias=True, exclude_none=True)
    base["tools"][0]["parameters"]["patternProperties"] = {"^x-": {"type": "string"}}
    spec = AgentSpec.model_validate(base)
    with caplog.at_level("WARNING", logger="instanced_stream.llm"):
        shape = initial_shape(spec)
    assert shape.response_format == "json_schema"
    assert "cannot be strict" in caplog.text and "patternProperties" in caplog.text


# The documentation's own cases, one rule each.
_OK: dict[str, Any] = {
    "type": "object",
    "properties": {"a": {"type": "string"}},
    "required": ["a"],
    "additionalProperties": False,
}


def _nested(depth: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(depth):
        schema = {
            "type": "object",
            "properties": {"x": schema},
            "required": ["x"],
            "additionalProperties": False,
        }
    return schema


@pytest.mark.parametrize(
    ("schema", "rule"),
    [
        ({"anyOf": [_OK, _OK]}, "root"),
        ({**_OK, "additionalProperties": True}, "additionalProperties"),
        ({**_OK, "required": []}, "required"),
        ({**_OK, "properties": {"a": {"type": "string", "default": "x"}}}, "'default'"),
        ({**_OK, "properties": {"a": {"type": "string", "minLength": 1}}}, "'minLength'"),
        ({**_OK, "properties": {"a": {"type": "string", "maxLength": 9}}}, "'maxLength'"),
        (
            {**_OK, "properties": {"a": {"type": "array", "items": {}, "uniqueItems": True}}},
            "'uniqueItems'",
        ),
        ({**_OK, "patternProperties": {"^x": {"type": "string"}}}, "'patternProperties'"),
        ({**_OK, "properties": {"a": {"allOf": [{"type": "string"}]}}}, "'allOf'"),
        ({**_OK, "properties": {"a": {"not": {"type": "string"}}}}, "'not'"),
        ({**_OK, "properties": {"a": {"oneOf": [{"type": "string"}]}}}, "'oneOf'"),
        ({**_OK, "if": {}, "then": {}, "else": {}}, "'if'"),
        (_nested(11), "depth"),
        (
            {
                **_OK,
                "properties": {f"p{k}": {"type": "string"} for k in range(5001)},
                "required": [f"p{k}" for k in range(5001)],
            },
            "properties",
        ),
        (
            {**_OK, "properties": {"a": {"type": "string", "enum": list(map(str, range(1001)))}}},
            "enum_values",
        ),
    ],
)
def test_the_documented_rules_each_catch_their_case(schema: dict[str, Any], rule: str) -> None:
    problems = violations(schema)
    assert any(rule in p for p in problems), problems


def test_the_documented_limits_themselves_are_allowed() -> None:
    assert violations(_OK) == []
    assert violations(_nested(10)) == []
    many = {"type": "string", "enum": list(map(str, range(1000)))}
    assert violations({**_OK, "properties": {"a": many}}) == []
    assert (
        violations(strict_form({"type": "object", "properties": {"a": {"type": "string"}}})) == []
    )
