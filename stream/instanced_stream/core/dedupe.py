"""The spec's `dedupe` section, and what makes two items twins: the same content as the
prompt shows it (its fields, state and plan; its id only where the spec shows ids), with
whitespace folded. Twins are asked once (runtime/pipeline/windows/twins.py)."""

from __future__ import annotations

import hashlib
import re
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field

from instanced_stream.core.instance import Instance

__all__ = ["Dedupe", "content_key"]

_SPACE = re.compile(r"\s+")
_NOT_SHOWN = ("_instance", "_id")  # the token and the id are the prompt's, not content


class Dedupe(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = Field(
        True,
        description="Items whose content is identical (the fields the prompt shows, "
        "whitespace folded) are asked once: within a window one stands for all its twins, "
        "across windows an answer is reused from the cache; every twin still gets its own "
        "records and call_ids. On by default; a spec with a plan only with `stateful`",
    )
    cache_ttl_s: float = Field(
        600.0, ge=0, description="How long an answer is reused for later twins (0: no cache)"
    )
    cache_items: int = Field(10_000, ge=1, description="Answers kept at most (oldest go first)")
    stateful: bool = Field(
        False,
        description="Also for a spec with a plan (state and plan are part of the content); "
        "off by default: a workflow's turn is rarely worth sharing",
    )


def _folded(value: Any) -> Any:
    if isinstance(value, str):
        return _SPACE.sub(" ", value).strip()
    if isinstance(value, dict):
        return {k: _folded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_folded(v) for v in value]
    return value


def content_key(inst: Instance, ids_shown: bool) -> str:
    """A digest of what the prompt shows of `inst`: equal for twins, whatever their ids,
    positions, key order or runs of whitespace."""
    shown = {k: v for k, v in inst.payload.items() if k not in _NOT_SHOWN}
    shown.setdefault("type", "input")
    content = {
        "item": _folded(shown),
        "id": inst.id if ids_shown else None,
        "state": _folded(inst.state) if inst.state else None,
        "plan": _folded(inst.plan) if inst.plan else None,
        "turn": inst.turn,  # a turn hears its own advisors
    }
    return hashlib.sha256(orjson.dumps(content, option=orjson.OPT_SORT_KEYS)).hexdigest()
