"""Builds ONE multi-instance chat request per batch (the Instancing protocol).

Everything static (instructions, protocol, tools, advisors, global inputs) goes first and
is byte-identical across batches, so providers' prompt-prefix caches hit. The model sees
positional tokens (①, ②, ...), never producers' ids: the k-th instance of every request
has the same token, so a request of n instances always has the same output schema, which
providers compile once and cache.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import orjson

from instanced_stream.core import call_meta, compact, instructions, keyed
from instanced_stream.core.instance import Instance
from instanced_stream.core.spec import CONSULT, NO_ACTION, AgentSpec, Tool
from instanced_stream.core.strict_form import MAX_ENUM_VALUES, enum_values, strict_form
from instanced_stream.core.tokenizer import estimate_tokens

# `Instance` lives in instanced_stream.core.instance; it is re-exported here for the modules that
# still import it from the prompt (solve, harness.eval).
__all__ = [
    "Ask",
    "Instance",
    "PromptBuilder",
    "estimate_tokens",
    "meta_tools",
    "token_for",
]

# Circled numbers 1-50 are one or two BPE tokens each and cannot be mistaken for data.
_CIRCLED = (
    [chr(0x2460 + i) for i in range(20)]
    + [chr(0x3251 + i) for i in range(15)]
    + [chr(0x32B1 + i) for i in range(15)]
)


def token_for(index: int) -> str:
    """The token of the index-th instance (0-based) of a request."""
    return _CIRCLED[index] if index < len(_CIRCLED) else f"#{index + 1}"


_NO_ACTION_TERSE = Tool(
    name=NO_ACTION,
    description="Use when an instance needs no action at all.",
)
NO_ACTION_TOOL = Tool(
    name=NO_ACTION,
    description="Use when an instance needs no action at all. Say why in 'reason'.",
    parameters={
        "type": "object",
        "properties": {"reason": {"type": "string"}},
        "required": ["reason"],
        "additionalProperties": False,
    },
)


@dataclass(frozen=True, slots=True)
class Ask:
    """Which advisors speak in a request, and whether the model may consult others."""

    active: tuple[str, ...] = ()
    consult: bool = False
    planning: bool = False  # a lazy plan's first turn: the graph only, no latent results


def _strict_parameters(schema: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """Strict structured output wants every property required, at every depth: optional
    ones become nullable, and the validator drops the nulls again before checking the
    tool schema (`core/strict_form.py`)."""
    props: dict[str, Any] = strict_form({**schema, "type": "object"}).get("properties", {})
    return props, list(props)


def _planned_parameters(tool: Tool, ask: Ask) -> tuple[dict[str, Any], list[str]]:
    """A tool's arguments in the answer's schema. A lazy plan's planning turn gives a
    latent step nothing to fill (every argument null): its result comes after approval."""
    props, required = _strict_parameters(tool.parameters)
    if ask.planning and tool.kind == "latent":
        props = {k: {"type": "null"} for k in props}
    return props, required


def _activity(spec: AgentSpec, tool: Tool) -> bool:
    """One of the spec's activities (not a meta tool, not latent): it may import its own
    instance's input through `_scopes`, whatever the spec."""
    return tool.kind == "activity" and spec.tool(tool.name) is not None


def _instance_schema(tokens: list[str], compact: bool, loose: bool = False) -> dict[str, Any]:
    """How the answer names an instance: its number (compact), else its token.
    `loose`: without an enum (a range, or any string), for batches whose enums would
    pass strict mode's limit on enum values; the validator refuses unknown ones."""
    if compact:
        if loose:
            return {"type": "integer", "minimum": 1, "maximum": len(tokens)}
        return {"type": "integer", "enum": list(range(1, len(tokens) + 1))}
    return {"type": "string"} if loose else {"type": "string", "enum": tokens}


def consult_tool(spec: AgentSpec) -> Tool:
    return Tool(
        name=CONSULT,
        description="Ask an on-demand advisor about one instance before deciding it.",
        parameters={
            "type": "object",
            "properties": {
                "advisor": {"type": "string", "enum": [a.id for a in spec.on_demand]},
                "question": {"type": "string"},
            },
            "required": ["advisor", "question"],
            "additionalProperties": False,
        },
    )


def meta_tools(spec: AgentSpec) -> list[Tool]:
    """The tools the product adds to the spec's: NoAction, and ConsultAdvisor when any
    advisor speaks only on demand."""
    # With reasoning off the product asks for no free text at all: NoAction gives no reason.
    no_action = _NO_ACTION_TERSE if spec.model.reasoning == "off" else NO_ACTION_TOOL
    return [no_action, *([consult_tool(spec)] if spec.on_demand else [])]


class PromptBuilder:
    def __init__(self, spec: AgentSpec) -> None:
        self.spec = spec
        self.tools = [*spec.tools, *meta_tools(spec)]
        self.stateful = spec.plan is not None or any(t.paths or t.output for t in spec.tools)
        self.compact = spec.model.answer == "compact"
        self.keyed = spec.model.answer == "keyed"
        self.numbered = spec.model.answer != "protocol"  # instances are 1, 2, ... not ①
        # The positions of each tool's compact call (the validator reads them back).
        self.call_fields = {
            t.name: compact.call_fields(
                t.parameters, spec.model.reasoning != "off", self.stateful, _activity(spec, t)
            )
            for t in self.tools
        }
        # A stateful spec's `_outputPath` and `_scopes` per tool (a stateless one has none).
        readable = call_meta.readable(spec) if self.stateful else []
        self._state_meta = {
            t.name: call_meta.state_meta(t, readable, _activity(spec, t))
            for t in self.tools
            if self.stateful
        }
        self.first_ask = self.ask_for(1)
        tools_json = _tools_json(self.tools, self.call_fields if self.compact else None)
        if self.compact:
            protocol = compact.PROTOCOL.replace(
                "{reasoning}", compact.REASONING_TEXT[spec.model.reasoning]
            )
        else:
            text = keyed.PROTOCOL if self.keyed else instructions.PROTOCOL
            protocol = text.replace("{reasoning}", instructions.REASONING[spec.model.reasoning])
        if spec.silence == "no_action":
            protocol += "\n" + instructions.SILENCE
        sections = [spec.instructions.strip(), protocol, "# Tools", tools_json]
        if self.stateful:
            stateful = instructions.STATEFUL if spec.plan else instructions.ONE_SHOT
            sections.insert(2, stateful)
        else:
            sections.insert(2, instructions.SCOPES)
        if spec.plan is not None:
            sections.append(instructions.plan_text(spec.plan))
        if spec.advisors:
            advisors_json = orjson.dumps(
                # An advisor's instance is a producer's id: the model sees it only as
                # the advisor being active in that instance's requests (ask_for).
                [
                    a.model_dump(by_alias=True, exclude={"type", "gates", "instance"})
                    for a in spec.advisors
                ]
            ).decode()
            finish = [instructions.FINISH] if any(a.on == "finish" for a in spec.advisors) else []
            sections += ["\n".join([instructions.ADVISORY, *finish]), advisors_json]
        if spec.inputs:
            globals_json = orjson.dumps(
                [m.model_dump(by_alias=True, exclude_none=True) for m in spec.inputs]
            ).decode()
            sections += ["# Global inputs", globals_json]
        self.system = "\n\n".join(sections)
        self._schema = lru_cache(maxsize=64)(self._build_schema)

    def _meta(self, tool: Tool, ask: Ask) -> dict[str, Any]:
        if self.stateful:
            meta = self._state_meta[tool.name]
            return call_meta.planned(tool, meta) if ask.planning else meta
        return call_meta.SCOPES if _activity(self.spec, tool) else {}

    def ask_for(self, turn: int, replanning: bool = False, instance: str | None = None) -> Ask:
        """Who speaks on an instance's turn (the seeds' `on`): `start` on the first turn,
        `request` on every turn, `finish` where the loop decides whether to stop: every
        turn, the first included (a workflow can end on any turn, its first too, and the
        one turn of a request without a plan); on-demand advisors only when consulted.
        An advisor defined for one instance (`_instance`) speaks on that `instance`'s turns
        only: the solver asks about it apart from instances that do not hear it."""
        plan = self.spec.plan
        speak = {"request": True, "start": turn == 1, "finish": True}
        active = tuple(
            a.id
            for a in self.spec.advisors
            if a.on is not None and speak[a.on] and a.instance in (None, instance)
        )
        lazy_first = plan is not None and plan.mode == "lazy" and (turn == 1 or replanning)
        return Ask(active, bool(self.spec.on_demand), lazy_first)

    def messages(
        self,
        instances: Sequence[Instance],
        ask: Ask | None = None,
        refused: Sequence[tuple[str, str]] = (),
        questions: Sequence[tuple[str, str, str]] = (),
        heard: Sequence[dict[str, Any]] = (),
    ) -> list[dict[str, str]]:
        """The request; `refused` (token, why) says what was wrong with the last answer
        for these instances. It comes last, so the cached prefix stays the same.
        `questions` (token, advisor, question): what the model asked consulted advisors;
        `heard`: the opinions request-wide advisors gave before a re-ask."""
        body = _body(instances, self.numbered, self.spec.instance_ids == "shown")
        messages = [
            {"role": "system", "content": self.system},
            {"role": "user", "content": orjson.dumps(body).decode()},
        ]
        if self.spec.advisors:
            ask = ask or self.first_ask
            # Questions name instances as the model does: numbers in the compact form.
            number = {token_for(k): k + 1 for k in range(len(instances))}
            control = instructions.control(
                self.spec, ask.active, ask.consult, questions, number if self.compact else {}
            )
            if heard:
                control["heard"] = list(heard)
            messages.append({"role": "user", "content": orjson.dumps(control).decode()})
        if refused:
            named = {token_for(k): k + 1 for k in range(len(instances))} if self.numbered else {}
            lines = "\n".join(f"{named.get(token, token)}: {why}" for token, why in refused)
            messages.append(
                {
                    "role": "user",
                    "content": "Your last answer did not settle these instances, for these "
                    f"reasons:\n{lines}\nAnswer again with valid calls for every instance.",
                }
            )
        return messages

    def output_cap(self, n: int) -> int:
        """Answer tokens a request of n instances may use: three times the expected size.
        A model that loops (a weak one repeats calls until its context is full) stops
        there; what it completed before is kept (see Validator) and the rest re-asked."""
        cap = n * 3 * self.spec.window.output_tokens_per_item + 200
        limit = self.spec.model.max_output_tokens
        return cap if limit is None else min(cap, limit)

    def response_format(self, n: int, ask: Ask | None = None) -> dict[str, Any]:
        if self.spec.model.structured_output == "json_object":
            return {"type": "json_object"}
        return self._schema(n, ask or self.first_ask)

    def _opinion_branches(
        self, ask: Ask, tokens: list[str], loose: bool = False
    ) -> list[dict[str, Any]]:
        branches = []
        for advisor_id in ask.active:
            advisor = self.spec.advisor(advisor_id)
            assert advisor is not None
            props, required = _strict_parameters(advisor.schema_)
            head: dict[str, Any] = {"id": {"type": "string", "enum": [advisor.id]}}
            if advisor.is_instanced:
                head["_instance"] = _instance_schema(tokens, self.numbered, loose)
            branches.append(
                {
                    "type": "object",
                    "additionalProperties": False,
                    "required": [*head, *required, "calls"],
                    "properties": {
                        **head,
                        **props,
                        "calls": {"type": "string", "description": "inline JSON of votes 0-100"},
                    },
                }
            )
        return branches

    def _compact_calls(self, tokens: list[str], ask: Ask, loose: bool = False) -> dict[str, Any]:
        """The compact answer's calls: one array per tool, each call a positional array.
        A thought's tool (latent, writing no path) comes first: strict output writes the
        groups in this order, and a thought informs the steps written after it (the
        seeds: it enriches "the later steps of the same solution"); the other tools keep
        the spec's order, which the plan's graph makes irrelevant to when a step runs."""
        groups: dict[str, Any] = {}
        bounded = self.spec.model.bounded_answer
        for tool in sorted(self.tools, key=lambda t: not (t.kind == "latent" and not t.paths)):
            if tool.name == CONSULT and not ask.consult:
                continue
            props, _ = _planned_parameters(tool, ask)
            fields = self.call_fields[tool.name]
            positions = [
                _instance_schema(tokens, self.compact, loose)
                if name == compact.INSTANCE
                else {"type": "string"}
                if name == compact.REASONING
                else self._meta(tool, ask).get(name) or props[name]
                for name in fields
            ]
            most = len(tokens) * tool.max_calls_per_instance if bounded else None
            groups[tool.name] = compact.group_schema(fields, positions, most)
        return {
            "type": "object",
            "additionalProperties": False,
            "required": list(groups),
            "properties": groups,
        }

    def _build_schema(self, n: int, ask: Ask) -> dict[str, Any]:
        # Every call and opinion names its instance: a large batch's enums alone can pass
        # the limit strict mode sets on enum values in one schema.
        built = self._compose(n, ask)
        big = enum_values(built["json_schema"]["schema"]) > MAX_ENUM_VALUES
        return self._compose(n, ask, loose=True) if big else built

    def _compose(self, n: int, ask: Ask, loose: bool = False) -> dict[str, Any]:
        tokens = [token_for(k) for k in range(n)]
        reasoning: dict[str, Any] = (
            {} if self.spec.model.reasoning == "off" else {"_reasoningForCall": {"type": "string"}}
        )
        branches = []
        for tool in self.tools:
            if tool.name == CONSULT and not ask.consult:
                continue
            props, required = _planned_parameters(tool, ask)
            branches.append(
                {
                    "type": "object",
                    "additionalProperties": False,
                    "required": [
                        "_tool",
                        "_instance",
                        *reasoning,
                        *self._meta(tool, ask),
                        *required,
                    ],
                    "properties": {
                        "_tool": {"type": "string", "enum": [tool.name]},
                        "_instance": _instance_schema(tokens, False, loose),
                        **reasoning,
                        **self._meta(tool, ask),
                        **props,
                    },
                }
            )
        calls: dict[str, Any] = (
            self._compact_calls(tokens, ask, loose)
            if self.compact
            else {"type": "array", "items": {"anyOf": branches}}
        )
        # A weak model may repeat calls until its context is full; the bound ends the
        # array where a sane answer ends (strict mode supports maxItems).
        most = max(1, sum(t.max_calls_per_instance for t in self.spec.tools)) + int(ask.consult)
        defs: dict[str, Any] = {}
        if self.keyed:
            calls, defs = keyed.calls_schema(n, branches, most, self.spec.model.bounded_answer)
        elif self.spec.model.bounded_answer and not self.compact:
            calls["maxItems"] = n * most
        if not self.spec.advisors:
            properties: dict[str, Any] = {"calls": calls}
        else:
            # Advisors come first, so the model states its advice before it decides.
            opinions = self._opinion_branches(ask, tokens, loose)
            speaking = [self.spec.advisor(a) for a in ask.active]
            most = sum(n if a is not None and a.is_instanced else 1 for a in speaking)
            advisors: dict[str, Any] = (
                {"type": "array", "items": {"anyOf": opinions}}
                | ({"maxItems": most} if self.spec.model.bounded_answer else {})
                if opinions
                else {"type": "array", "maxItems": 0}
            )
            properties = {"advisors": advisors, "calls": calls}
        schema = {
            "type": "object",
            "additionalProperties": False,
            "required": list(properties),
            "properties": properties,
            **({"$defs": defs} if defs else {}),
        }
        return {
            "type": "json_schema",
            "json_schema": {"name": "solution", "strict": True, "schema": schema},
        }


def _body(instances: Sequence[Instance], numbered: bool, shown: bool) -> list[dict[str, Any]]:
    """The user message: each instance's input, state and plan, named by its token
    (`numbered`: the compact form's numbers), its producer id only when `shown`."""
    body: list[dict[str, Any]] = []
    for k, inst in enumerate(instances):
        # The compact form numbers instances: 1 is one token, ① two or three.
        token: str | int = k + 1 if numbered else token_for(k)
        # "type": "input" is the default: said once in the protocol, not per item.
        kind = inst.payload.get("type", "input")
        body.append(
            {
                **({"type": kind} if kind != "input" else {}),
                "_instance": token,
                # Shown only: calls name the token, the only way back to the id.
                **({"_id": inst.id} if shown else {}),
                **{
                    key: v
                    for key, v in inst.payload.items()
                    if key not in ("type", "_id", "_instance")
                },
            }
        )
        if inst.state and inst.payload.get("type") != "state":
            # State is data too: a key of it can never rename the instance.
            kept = {k: v for k, v in inst.state.items() if k not in ("type", "_instance")}
            body.append({"type": "state", "_instance": token, **kept})
        if inst.plan:
            body.append({"type": "plan", "_instance": token, "steps": inst.plan})
        if inst.rejected:
            body.append({"type": "rejected", "_instance": token, "versions": inst.rejected})
    return body


def _tools_json(tools: Sequence[Tool], call_fields: dict[str, list[str]] | None) -> str:
    """The tools as the system prompt lists them (`call_fields`: the compact answer's
    positions of each tool's values)."""
    return orjson.dumps(
        [
            {
                "name": t.name,
                "description": t.description,
                "parameters": t.parameters,
                # Only where they say something: latent tools, and where results go.
                **({"kind": t.kind} if t.kind != "activity" else {}),
                **({"paths": t.paths} if t.paths else {}),
                **({"call": call_fields[t.name]} if call_fields is not None else {}),
                # The result's schema, for the calls that await it (the seeds').
                **({"_output": t.output} if t.output else {}),
            }
            for t in tools
        ]
    ).decode()
