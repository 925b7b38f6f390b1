"""A chat request as the simulator reads it (`SimRequest`, `read_request`): the tools and
advisors of its system message, the instances of its JSON array, which advisors speak.
The judge answers one and the router picks its tools; neither owns it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from instanced_stream_bench.testing.sim.wording import reasoning_of

__all__ = ["SimRequest", "read_request"]


@dataclass(frozen=True, slots=True)
class SimRequest:
    system: str
    tools: list[dict[str, Any]]
    items: list[dict[str, Any]]
    advisors: list[dict[str, Any]]
    active: tuple[str, ...]
    may_consult: bool
    instruction: str = ""
    # The answer the request asks for: the compact form's call positions per tool (empty:
    # the protocol form), and how much reasoning (full, brief, off).
    call_fields: dict[str, list[str]] = field(default_factory=dict)
    reasoning: str = "full"
    # json_object mode: no schema holds the answer's keys, so the simulator may write as
    # the seeds do (the manager seed's `"output": "†state"`, a shown id for `_instance`).
    free_form: bool = False


def read_request(messages: list[dict[str, str]]) -> SimRequest:
    """Finds tools and advisors (system message), the instances (the user message that
    is a JSON array) and which advisors speak (the user message that is an object)."""
    system = next(m["content"] for m in messages if m["role"] == "system")
    sections = system.split("\n\n")
    tools = orjson.loads(sections[sections.index("# Tools") + 1])
    advisors: list[dict[str, Any]] = []
    instruction = ""
    for k, section in enumerate(sections[:-1]):
        if section.startswith("# Advisors"):
            advisors = orjson.loads(sections[k + 1])
        if section == "# Global inputs":
            for message in orjson.loads(sections[k + 1]):
                instruction += str(message.get("instruction", ""))
    items: list[dict[str, Any]] = []
    control: dict[str, Any] = {}
    for m in messages:
        if m["role"] != "user":
            continue
        try:
            data = orjson.loads(m["content"])
        except orjson.JSONDecodeError:
            continue  # prose: a re-ask's reasons, which the simulator does not read
        if isinstance(data, list):
            items = [d for d in data if isinstance(d, dict) and "_instance" in d]
        elif isinstance(data, dict):
            control = data
    fields = {t["name"]: t["call"] for t in tools if "call" in t}
    return SimRequest(
        system,
        tools,
        items,
        advisors,
        tuple(control.get("activeAdvisors", ())),
        bool(control.get("mayConsult", False)),
        instruction,
        fields,
        reasoning_of(system, fields),
    )
