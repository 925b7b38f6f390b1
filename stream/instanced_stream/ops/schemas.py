"""Renders every message contract into JSON Schema files (`stream schemas`).

The pydantic models are the source of truth; the files in schemas/ are for people and
for other languages, and a test fails when they drift from the models. What people write
and the product reads (the agent spec and its parts, results, approvals) is rendered in
pydantic's validation mode, with every spelling the models accept, so a spec that loads
also validates against its schema; what the product writes is rendered as it is written
(serialization mode).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import orjson
from pydantic import AliasChoices, BaseModel

from instanced_stream.core import spec as spec_models
from instanced_stream.core.idea_process import IdeaProcessRecord
from instanced_stream.core.messages import (
    ActivityRecord,
    AdviceRecord,
    ApprovalRecord,
    Call,
    DeadLetter,
    DoneRecord,
    NoActionRecord,
    ProposalRecord,
    ResultRecord,
    StateUpdateRecord,
)
from instanced_stream.core.spec import Advisor, AgentSpec, ContextMessage, Plan, Tool

__all__ = ["CONTRACTS", "INPUTS", "render", "write_schemas"]

CONTRACTS: dict[str, type[BaseModel]] = {
    "agent-spec": AgentSpec,
    "tool": Tool,
    "advisor": Advisor,
    "plan": Plan,
    "context-message": ContextMessage,
    "call": Call,
    "activity-record": ActivityRecord,
    "no-action-record": NoActionRecord,
    "state-update-record": StateUpdateRecord,
    "idea-process-record": IdeaProcessRecord,
    "advice-record": AdviceRecord,
    "result-record": ResultRecord,
    "done-record": DoneRecord,
    "proposal-record": ProposalRecord,
    "approval-record": ApprovalRecord,
    "dead-letter": DeadLetter,
}


# Read by the product: validated as input, so rendered in validation mode.
INPUTS = frozenset(
    {"agent-spec", "tool", "advisor", "plan", "context-message", "result-record", "approval-record"}
)


def _names(model: type[BaseModel], field: str) -> list[str]:
    """Every key a model accepts for one field: its aliases (all of an AliasChoices) and,
    with populate_by_name, the field's own name (not a Python-only one like `schema_`)."""
    info = model.model_fields[field]
    chosen = info.validation_alias
    if isinstance(chosen, AliasChoices):
        names = [c for c in chosen.choices if isinstance(c, str)]
    else:
        names = [chosen if isinstance(chosen, str) else info.alias or field]
    if model.model_config.get("populate_by_name") and not field.endswith("_"):
        names.append(field)
    return names


def _every_spelling(schema: dict[str, Any], root: type[BaseModel]) -> dict[str, Any]:
    """pydantic names each property once; add the other keys the models accept (the
    seeds' `kind` for an advisor's `type`, `output` beside `_output`), same schema."""
    models = {
        cls.__name__: cls
        for cls in vars(spec_models).values()
        if isinstance(cls, type) and issubclass(cls, BaseModel)
    }
    targets = [(root, schema)] + [
        (models[name], sub) for name, sub in schema.get("$defs", {}).items() if name in models
    ]
    for model, target in targets:
        properties = target.get("properties", {})
        for field in model.model_fields:
            names = _names(model, field)
            shown = next((n for n in names if n in properties), None)
            for name in names:
                if shown is not None and name not in properties:
                    properties[name] = properties[shown]
    return schema


def render() -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    for name, model in CONTRACTS.items():
        mode: Literal["validation", "serialization"] = (
            "validation" if name in INPUTS else "serialization"
        )
        schema: dict[str, Any] = model.model_json_schema(by_alias=True, mode=mode)
        if mode == "validation":
            schema = _every_spelling(schema, model)
        schema = {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema}
        out[f"{name}.json"] = orjson.dumps(schema, option=orjson.OPT_INDENT_2) + b"\n"
    return out


def write_schemas(folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for filename, content in render().items():
        path = folder / filename
        path.write_bytes(content)
        written.append(path)
    return written
