"""The JSON Schema of every topic the processor writes, as Schema Registry subjects.

Subjects follow the topic-name strategy (`<topic>-value`). An activity topic's schema is
the activity record's with its `call` narrowed to the tool's parameters, so a spec change
that breaks a downstream consumer (a parameter that changes type, a new required one) is a
change of that subject a registry can judge; the other topics carry the message models'
schemas as `stream schemas` writes them.
"""

from __future__ import annotations

import copy
from typing import Any

import orjson
from pydantic import BaseModel

from instanced_stream.core.messages import (
    ActivityRecord,
    AdviceRecord,
    DeadLetter,
    DoneRecord,
    NoActionRecord,
    ProposalRecord,
    StateUpdateRecord,
)
from instanced_stream.core.spec import AgentSpec, Tool
from instanced_stream.settings import Topics

__all__ = ["activity_schema", "output_schemas", "subject_of"]

_DRAFT = "http://json-schema.org/draft-07/schema#"  # as validators know it (http)


def subject_of(topic: str) -> str:
    """The topic-name strategy: one subject per topic, for record values."""
    return f"{topic}-value"


def _schema(model: type[BaseModel]) -> dict[str, Any]:
    schema = model.model_json_schema(by_alias=True, mode="serialization")
    # draft-07: what registries' JSON Schema support and compatibility checks know best;
    # the models' schemas use nothing newer.
    return {"$schema": _DRAFT, **schema}


def activity_schema(tool: Tool) -> dict[str, Any]:
    """The activity record of one tool: its `call` holds the call's meta properties and
    the tool's own parameters (their types and which are required)."""
    schema = _schema(ActivityRecord)
    call: dict[str, Any] = copy.deepcopy(schema["$defs"]["Call"])
    params = tool.parameters
    call["properties"] = {**call.get("properties", {}), **params.get("properties", {})}
    call["required"] = [*call.get("required", []), *params.get("required", [])]
    # Closed when the tool's parameters are: a registry then takes a new optional
    # parameter as compatible (in an open model any old record could hold it, typed
    # otherwise, so adding one breaks backward compatibility there).
    call["additionalProperties"] = params.get("additionalProperties", True)
    call["title"] = f"Call of {tool.name}"
    schema["properties"]["call"] = call
    schema["title"] = f"ActivityRecord of {tool.name}"
    return schema


def output_schemas(spec: AgentSpec, topics: Topics) -> dict[str, str]:
    """Every output topic and its schema text (compact, keys sorted: the same spec gives
    the same text, so registering it again finds the version already there)."""
    out: dict[str, dict[str, Any]] = {
        tool.topic or topics.activity(tool.name): activity_schema(tool)
        for tool in spec.tools
        if tool.kind == "activity"
    }
    out[topics.review] = _schema(ActivityRecord)
    out[topics.no_action] = _schema(NoActionRecord)
    out[topics.state_updates] = _schema(StateUpdateRecord)
    out[topics.dead_letter] = _schema(DeadLetter)
    out[topics.advice] = _schema(AdviceRecord)
    out[topics.done] = _schema(DoneRecord)
    out[topics.proposals] = _schema(ProposalRecord)
    return {
        topic: orjson.dumps(schema, option=orjson.OPT_SORT_KEYS).decode()
        for topic, schema in out.items()
    }
