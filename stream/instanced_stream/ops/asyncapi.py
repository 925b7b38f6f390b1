"""The product's topics as an AsyncAPI 3.0 document (`stream schemas` writes it beside
schemas/), so a team in any language can generate a consumer or producer for them.

Built from the same pydantic models as schemas/; a test fails when the file drifts.
Channel addresses carry the deployment's `{prefix}` (STREAM_TOPIC_PREFIX); the input
topic's name is the default STREAM_INPUT_TOPIC.
"""

from __future__ import annotations

from typing import Any

import yaml
from pydantic import BaseModel

from instanced_stream import __version__
from instanced_stream.core.idea_process import IdeaProcessRecord
from instanced_stream.core.messages import (
    ActivityRecord,
    AdviceRecord,
    ApprovalRecord,
    DeadLetter,
    DoneRecord,
    NoActionRecord,
    ProposalRecord,
    ResultRecord,
    StateUpdateRecord,
)
from instanced_stream.core.spec import ContextMessage

__all__ = ["CHANNELS", "document", "render_asyncapi"]

_REF = "#/components/schemas/{model}"

_ITEM: dict[str, Any] = {
    "type": "object",
    "description": "One instance's data; any fields the agent spec's prompt uses. Without "
    "`_instance` the record key is the instance id; with neither it is dead-lettered.",
    "properties": {"_instance": {"type": "string", "description": "The instance id"}},
    "additionalProperties": True,
}

# channel id: (address, payload model or None for the input item, who sends, summary)
CHANNELS: dict[str, tuple[str, type[BaseModel] | None, str, str]] = {
    "items": ("items", None, "producers", "Input items, one record per instance"),
    "activity": (
        "activity.{tool}",
        ActivityRecord,
        "processor",
        "Validated calls of one tool, for its activity workers",
    ),
    "results": ("stream.results", ResultRecord, "workers", "Results of awaited calls"),
    "noaction": ("stream.noaction", NoActionRecord, "processor", "Explicit no-action outcomes"),
    "stateupdates": (
        "stream.stateupdates",
        StateUpdateRecord,
        "processor",
        "State updates of a spec without a plan (latent calls writing †state)",
    ),
    "ideas": (
        "stream.ideas",
        IdeaProcessRecord,
        "processor",
        "Each plan's Idea Process: per plan edition and input partition, its steps' counts"
        " (compacted)",
    ),
    "deadletter": ("stream.deadletter", DeadLetter, "processor", "Refused records, with why"),
    "advice": ("stream.advice", AdviceRecord, "processor", "Advisors' votes per instance"),
    "review": ("stream.review", ActivityRecord, "processor", "Calls held by the advice gate"),
    "done": ("stream.done", DoneRecord, "processor", "Final state of finished workflows"),
    "proposals": ("stream.proposals", ProposalRecord, "processor", "Lazy-plan proposals"),
    "approvals": ("stream.approvals", ApprovalRecord, "people", "Approvals of proposals"),
    "context": ("stream.context", ContextMessage, "operators", "Global messages (compacted)"),
}

# Results and approvals are applied by the unit that owns their instance's partition (one
# transaction holds the instance's state and the answer's offset): written there they are
# applied at once; written elsewhere they are forwarded there first (docs/contracts.md).
_PARTITIONED: dict[str, str] = {
    "ResultRecord": "Write it to the instance's partition: the `source.partition` of the "
    "ActivityRecord it answers, set explicitly, or keyed by the instance id (the default "
    "partitioner finds the same partition for a stateful spec). On another partition it "
    "is forwarded there first, in the processor's transaction, and applied once.",
    "ApprovalRecord": "Write it to the instance's partition: the `source.partition` of the "
    "ProposalRecord it answers, set explicitly, or keyed by the instance id. On another "
    "partition it is forwarded there first, in the processor's transaction, and applied "
    "once.",
}

_HEADERS = {
    "type": "object",
    "properties": {
        "traceparent": {
            "type": "string",
            "description": "W3C Trace Context; copied from the input record to every "
            "record it leads to",
            "pattern": "^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$",
        },
        "tracestate": {
            "type": "string",
            "description": "W3C Trace Context vendor state; copied along with its traceparent",
            "maxLength": 512,
        },
    },
}


def _schemas() -> dict[str, Any]:
    """Every payload model's JSON Schema, nested models hoisted to components."""
    out: dict[str, Any] = {"Item": _ITEM}
    for _, model, _, _ in CHANNELS.values():
        if model is None or model.__name__ in out:
            continue
        schema = model.model_json_schema(by_alias=True, mode="serialization", ref_template=_REF)
        out.update(schema.pop("$defs", {}))
        out[model.__name__] = schema
    return dict(sorted(out.items()))


def document() -> dict[str, Any]:
    channels: dict[str, Any] = {}
    operations: dict[str, Any] = {}
    messages: dict[str, Any] = {}
    for cid, (address, model, sender, summary) in CHANNELS.items():
        name = model.__name__ if model else "Item"
        kafka: dict[str, Any] = {"key": {"type": "string", "description": "Instance id"}}
        messages[name] = {
            "name": name,
            "contentType": "application/json",
            "headers": _HEADERS,
            "payload": {"$ref": _REF.format(model=name)},
            "bindings": {"kafka": kafka},
        }
        if name in _PARTITIONED:
            messages[name]["description"] = _PARTITIONED[name]
            kafka["x-partition"] = "source.partition of the record it answers"
        channels[cid] = {
            "address": "{prefix}" + address,
            "description": summary,
            "parameters": {"prefix": {"description": "STREAM_TOPIC_PREFIX (may be empty)"}}
            | (
                {"tool": {"description": "A tool's name in the agent spec"}}
                if "{tool}" in address
                else {}
            ),
            "messages": {name: {"$ref": f"#/components/messages/{name}"}},
        }
        # The document describes the product: it receives what others send, and the
        # reverse; `x-sender` says who writes the topic.
        operations[f"{'receive' if sender != 'processor' else 'send'}-{cid}"] = {
            "action": "receive" if sender != "processor" else "send",
            "channel": {"$ref": f"#/channels/{cid}"},
            "x-sender": sender,
        }
    return {
        "asyncapi": "3.0.0",
        "info": {
            "title": "instanced-stream",
            "version": __version__.split("+")[0],
            "description": "Batched, multi-instance LLM decisions on Kafka: the topics and "
            "their JSON records. Generated by `stream schemas`; do not edit.",
            "license": {"name": "Apache-2.0"},
        },
        "defaultContentType": "application/json",
        "channels": channels,
        "operations": operations,
        "components": {"messages": dict(sorted(messages.items())), "schemas": _schemas()},
    }


def render_asyncapi() -> bytes:
    return yaml.safe_dump(document(), sort_keys=False, allow_unicode=True, width=100).encode()
