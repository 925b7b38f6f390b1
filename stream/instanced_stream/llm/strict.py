"""OpenAI's subset of JSON Schema for strict structured outputs, as its documentation
states it: a schema sent with `strict: true` outside it is refused (400 `invalid_schema`)
by OpenAI and Azure OpenAI, so the product checks its own before sending.

The rules: the root is an object (not `anyOf`); every object has `additionalProperties:
false` and lists every property in `required` (an optional field is a union with null);
only the supported keywords appear (types string, number, integer, boolean, object,
array, null; `enum`, `const`, `anyOf`, `$ref` and `$defs`; strings `pattern` and
`format`; numbers `minimum`, `maximum`, `exclusiveMinimum`, `exclusiveMaximum`,
`multipleOf`; arrays `items`, `minItems`, `maxItems`; `description` and `title`
anywhere); at most 10 levels of object nesting, 5,000 object properties and 1,000 enum
values in all, and 120,000 characters of property names, enum and const values.
"""

from __future__ import annotations

from typing import Any

__all__ = ["LIMITS", "violations"]

LIMITS = {"depth": 10, "properties": 5000, "enum_values": 1000, "characters": 120_000}

_TYPES = frozenset({"string", "number", "integer", "boolean", "object", "array", "null"})
_ANY = frozenset(
    {"type", "description", "title", "enum", "const", "anyOf", "$ref", "$defs", "definitions"}
)
_BY_TYPE = {
    "string": frozenset({"pattern", "format"}),
    "number": frozenset(
        {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"}
    ),
    "integer": frozenset(
        {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"}
    ),
    "object": frozenset({"properties", "required", "additionalProperties"}),
    "array": frozenset({"items", "minItems", "maxItems"}),
    "boolean": frozenset(),
    "null": frozenset(),
}


class _Walk:
    def __init__(self) -> None:
        self.problems: list[str] = []
        self.properties = 0
        self.enum_values = 0
        self.characters = 0
        self.depth = 0

    def node(self, schema: Any, where: str, depth: int) -> None:
        if not isinstance(schema, dict):
            self.problems.append(f"{where}: a schema must be an object")
            return
        types = schema.get("type")
        named = [types] if isinstance(types, str) else list(types or [])
        for t in named:
            if t not in _TYPES:
                self.problems.append(f"{where}: type {t!r} is not supported")
        allowed = set(_ANY)
        for t in named:
            allowed |= _BY_TYPE.get(t, frozenset())
        if not named and not {"anyOf", "$ref", "enum", "const"} & schema.keys():
            self.problems.append(f"{where}: no type (every schema needs one)")
        for key in schema:
            if key not in allowed:
                self.problems.append(f"{where}: keyword {key!r} is not supported")
        for value in list(schema.get("enum") or []) + (
            [schema["const"]] if "const" in schema else []
        ):
            self.characters += len(str(value))
        self.enum_values += len(schema.get("enum") or [])
        if "object" in named:
            self.obj(schema, where, depth + 1)
        if "array" in named and "items" in schema:
            self.node(schema["items"], f"{where}.items", depth)
        for k, branch in enumerate(schema.get("anyOf") or []):
            self.node(branch, f"{where}.anyOf[{k}]", depth)
        for name, sub in (schema.get("$defs") or {}).items():
            self.characters += len(name)
            self.node(sub, f"{where}.$defs.{name}", depth)

    def obj(self, schema: dict[str, Any], where: str, depth: int) -> None:
        self.depth = max(self.depth, depth)
        props = schema.get("properties") or {}
        if schema.get("additionalProperties") is not False:
            self.problems.append(f"{where}: additionalProperties must be false")
        missing = [name for name in props if name not in (schema.get("required") or [])]
        if missing:
            self.problems.append(
                f"{where}: every property must be required (optional ones as a union with "
                f"null): {', '.join(missing)}"
            )
        self.properties += len(props)
        for name, sub in props.items():
            self.characters += len(name)
            self.node(sub, f"{where}.{name}", depth)


def violations(schema: dict[str, Any]) -> list[str]:
    """Where `schema` leaves the strict subset, one line each; empty: it may be strict."""
    walk = _Walk()
    if schema.get("type") != "object" or "anyOf" in schema:
        walk.problems.append("root: must be an object, not anyOf")
    walk.node(schema, "root", 0)
    for name, value in (
        ("depth", walk.depth),
        ("properties", walk.properties),
        ("enum_values", walk.enum_values),
        ("characters", walk.characters),
    ):
        if value > LIMITS[name]:
            walk.problems.append(f"{name}: {value} exceeds the limit of {LIMITS[name]}")
    return walk.problems
