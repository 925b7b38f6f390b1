"""A tool's or advisor's JSON Schema in the form strict structured output takes.

Strict mode wants every property required and no open objects, and knows only a subset
of JSON Schema's keywords (see `instanced_stream.llm.strict`). What only narrows valid values
(`minLength`, `default`, `uniqueItems`, ...) is dropped from what is sent: the validator
still checks every answer against the schema as written. What shapes the answer itself
(`allOf`, `not`, `if`, `patternProperties`, an object open to any key) is kept, and the
request goes non-strict, said once at start.
"""

from __future__ import annotations

from typing import Any

__all__ = ["MAX_ENUM_VALUES", "enum_values", "strict_form", "without_nulls"]

# Strict structured output takes at most this many enum values in one schema (OpenAI).
MAX_ENUM_VALUES = 1000

# Narrowing only: the validator enforces them after parsing.
_DROPPED = frozenset(
    {
        "default",
        "examples",
        "minLength",
        "maxLength",
        "uniqueItems",
        "minProperties",
        "maxProperties",
        "contains",
        "minContains",
        "maxContains",
        "$schema",
        "$id",
        "$comment",
        "readOnly",
        "writeOnly",
        "deprecated",
    }
)


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    if schema.get("type") == "null":
        return schema
    return {"anyOf": [schema, {"type": "null"}]}


def strict_form(schema: Any) -> Any:
    """`schema` with every object closed and its properties required (the optional ones
    nullable: the validator drops nulls before it checks), `oneOf` as `anyOf` (the
    validator checks that exactly one holds), narrowing-only keywords dropped."""
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in _DROPPED:
            continue
        if key in ("anyOf", "oneOf"):
            out["anyOf"] = [strict_form(v) for v in value]
        elif key == "items":
            out[key] = strict_form(value)
        elif key in ("$defs", "definitions"):
            out[key] = {k: strict_form(v) for k, v in value.items()}
        elif key != "properties":
            out[key] = value
    props = schema.get("properties")
    if isinstance(props, dict):
        required = set(schema.get("required", []))
        out["properties"] = {
            name: strict_form(sub) if name in required else _nullable(strict_form(sub))
            for name, sub in props.items()
        }
        out["required"] = list(props)
    is_object = schema.get("type") == "object" or (
        isinstance(schema.get("type"), list) and "object" in schema["type"]
    )
    if is_object and "additionalProperties" not in schema:
        out["additionalProperties"] = False
    return out


def without_nulls(value: Any, schema: Any) -> Any:
    """An answer made under `strict_form(schema)` back in `schema`'s terms: the nulls
    strict mode wrote for optional properties removed, at every depth (absent is what
    the schema means; a null it allows is kept where the property is required)."""
    if not isinstance(schema, dict):
        return value
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        required = set(schema.get("required", []))
        return {
            k: without_nulls(v, props.get(k))
            for k, v in value.items()
            if v is not None or k in required or k not in props
        }
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [without_nulls(v, schema["items"]) for v in value]
    return value


def enum_values(schema: Any) -> int:
    """How many enum values `schema` holds, at every depth."""
    if isinstance(schema, list):
        return sum(enum_values(s) for s in schema)
    if not isinstance(schema, dict):
        return 0
    own = len(schema["enum"]) if isinstance(schema.get("enum"), list) else 0
    return own + sum(enum_values(v) for k, v in schema.items() if k != "enum")
