"""Renders every message contract into JSON Schema files (`stream schemas`).

The pydantic models are the source of truth; the files in schemas/ are for people and
for other languages, and a test fails when they drift from the models.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
from pydantic import BaseModel

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
)
from instanced_stream.core.spec import Advisor, AgentSpec, ContextMessage, Plan, Tool

__all__ = ["CONTRACTS", "render", "write_schemas"]

CONTRACTS: dict[str, type[BaseModel]] = {
    "agent-spec": AgentSpec,
    "tool": Tool,
    "advisor": Advisor,
    "plan": Plan,
    "context-message": ContextMessage,
    "call": Call,
    "activity-record": ActivityRecord,
    "no-action-record": NoActionRecord,
    "advice-record": AdviceRecord,
    "result-record": ResultRecord,
    "done-record": DoneRecord,
    "proposal-record": ProposalRecord,
    "approval-record": ApprovalRecord,
    "dead-letter": DeadLetter,
}


def render() -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    for name, model in CONTRACTS.items():
        schema: dict[str, Any] = model.model_json_schema(by_alias=True, mode="serialization")
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
