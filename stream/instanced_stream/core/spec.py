"""The agent spec: one file declaring tools, advisors, plan, global inputs, model and window.

Validated at start-up so a bad spec stops the process with a message naming the field,
instead of failing on the first batch.
"""

from __future__ import annotations

import os
import re
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

import orjson
import yaml
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from instanced_stream.core.budget import Budget
from instanced_stream.core.cache_rule import CacheRule, PresetName, preset_rule
from instanced_stream.core.dedupe import Dedupe
from instanced_stream.core.endpoint import BatchTier, RequestShapeSpec, SecondModel
from instanced_stream.core.interpolate import interpolate
from instanced_stream.core.quality import Quality
from instanced_stream.errors import SpecError

__all__ = [
    "CONSULT",
    "NO_ACTION",
    "AdviceSettings",
    "Advisor",
    "AgentSpec",
    "BatchTier",
    "CacheRule",
    "ContextMessage",
    "ModelEndpoint",
    "Plan",
    "Quality",
    "RequestShapeSpec",
    "SecondModel",
    "Tool",
    "Window",
    "load_spec",
    "spec_document",
]

# The model's explicit way to say "this instance needs nothing": an outcome that is
# recorded, so that it is never confused with an instance the model skipped.
NO_ACTION = "NoAction"

# The meta-tool through which the model asks an on-demand advisor (on: null).
CONSULT = "ConsultAdvisor"

_NAME = r"^[A-Za-z][A-Za-z0-9_]{0,63}$"
# Advisor ids are personas' names: the seeds' `аналитикРисков`, any script's letters.
_ADVISOR_ID = re.compile(r"[^\W\d_][\w]{0,63}")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class Tool(_Strict):
    type: Literal["tool"] = "tool"
    name: str = Field(pattern=_NAME)
    description: str
    parameters: dict[str, Any] = Field(
        default_factory=lambda: {"type": "object", "properties": {}},
        description="JSON Schema of the call's arguments",
    )
    kind: Literal["activity", "latent"] = "activity"
    topic: str | None = Field(None, description="Activity topic; default activity.<name>")
    output: dict[str, Any] | None = Field(
        None,
        alias="_output",
        description="JSON Schema of the activity's result (the seeds' `_output`; `output` "
        "is accepted too): shown to the model for awaited calls, and a result that breaks "
        "it is dead-lettered as bad_result and recorded as the call's error",
    )
    paths: list[str] = Field(
        default_factory=list,
        description="State paths (†state.x) its result may be written to; two or more: "
        "the activity chooses (a branch)",
    )
    max_calls_per_instance: int = Field(
        1,
        ge=1,
        description="Calls of this tool one instance may get in one answer; the model's "
        "extra calls are refused as duplicate_call (the first ones count)",
    )

    @field_validator("parameters")
    @classmethod
    def _is_object_schema(cls, value: dict[str, Any]) -> dict[str, Any]:
        try:
            Draft202012Validator.check_schema(value)
        except SchemaError as exc:
            raise ValueError(f"not a valid JSON Schema: {exc.message}") from exc
        if value.get("type") != "object":
            raise ValueError('parameters must be a JSON Schema with "type": "object"')
        reserved = [p for p in value.get("properties", {}) if p.startswith("_")]
        if reserved:
            raise ValueError(f"parameter names starting with '_' are reserved: {reserved}")
        return value


class Advisor(_Strict):
    # The seeds write `type: "advisor"` in one text and `kind: "advisor"` in another.
    type: Literal["advisor"] = Field("advisor", validation_alias=AliasChoices("type", "kind"))
    id: str = Field(description="Letters (any script), digits and _; e.g. аналитикРисков")
    role: str
    schema_: dict[str, Any] = Field(
        default_factory=lambda: {"type": "object", "properties": {}}, alias="schema"
    )
    on: Literal["start", "finish", "request"] | None = None
    scopes: list[str] = Field(default_factory=list)
    is_instanced: bool = Field(False, alias="isInstanced")
    weight: float = Field(1.0, ge=0, description="Its votes' weight (shown to the model)")
    gates: bool = Field(False, description="Request-wide: its opinion gates each instance")
    instance: str | None = Field(
        None,
        alias="_instance",
        description="The seeds' instanced advisor definition: it speaks about this instance "
        "(the producer's id) only, and needs isInstanced: true",
    )

    @model_validator(mode="after")
    def _instance_needs_instanced(self) -> Advisor:
        if self.instance is not None and not self.is_instanced:
            raise ValueError(
                f"advisor {self.id!r} carries _instance {self.instance!r}: an advisor for one "
                "instance gives one opinion per instance, so it needs isInstanced: true"
            )
        return self

    @field_validator("id")
    @classmethod
    def _is_identifier(cls, value: str) -> str:
        if not _ADVISOR_ID.fullmatch(value):
            raise ValueError(
                "an advisor id is a letter (any script) then letters, digits or _, "
                f"at most 64; got {value!r}"
            )
        return value


class AdviceSettings(_Strict):
    """What the council's consensus does to the calls of an instance."""

    mode: Literal["record", "gate"] = Field(
        "record", description="record: attach to the call; gate: send doubtful calls to review"
    )
    min_score: float = Field(
        0.5, ge=0, le=1, description="gate: below this consensus score, calls go to review"
    )
    clear_score: float = Field(
        0.7, ge=0, le=1, description="gate: a call against a consensus this clear goes to review"
    )
    divergence_alert: float = Field(
        0.3, ge=0, le=1, description="instances whose advisors diverge this much are flagged"
    )
    max_consults: int = Field(1, ge=0, le=3, description="ConsultAdvisor rounds per instance")
    missing: Literal["review", "allow"] = Field(
        "review",
        description="gate: a call of an instance whose active instanced advisors gave no "
        "valid opinion (after one re-ask) goes to review (fails closed); allow: it runs",
    )


class Plan(_Strict):
    """The seeds' Plan message: a template the model plans by. Each instance's plan is the
    model's own: its calls, linked by the `†state` paths they write and read."""

    type: Literal["plan"] = "plan"
    mode: Literal["eager", "lazy"] = Field(
        "eager",
        description="eager: planning is execution (latent steps answered in the same "
        "generation); lazy: the model only writes the dataflow graph, run once approved",
    )
    goal: str | None = Field(None, description="What every instance's plan is for")
    constraints: list[str] = Field(
        default_factory=list, description="Rules every plan must keep, told to the model"
    )
    steps: list[str] = Field(default_factory=list, description="Hints of a plan's usual steps")
    max_turns: int = Field(5, ge=1, alias="maxTurns")
    max_revisions: int = Field(0, ge=0, alias="maxRevisions", description="Lazy: re-plans")


class ContextMessage(BaseModel):
    """An input or state message. Without `_instance` it is global: every instance sees it."""

    model_config = ConfigDict(extra="allow", frozen=True, populate_by_name=True)

    type: Literal["input", "state"] = "input"
    instance: str | None = Field(None, alias="_instance")


class ModelEndpoint(_Strict):
    base_url: str | None = Field(
        None, description="OpenAI-compatible endpoint; unset: the bundled LLM simulator"
    )
    name: str = "stream-sim-1"
    api_key_env: str = Field("OPENAI_API_KEY", description="Env var holding the API key")
    api_key_file: Path | None = Field(None, description="File holding the API key")
    structured_output: Literal["json_schema", "json_object"] = Field(
        "json_schema", description="json_schema is strict; json_object for endpoints without it"
    )
    bounded_answer: bool = Field(
        True,
        description="Bound the answer's arrays (maxItems) so a model cannot repeat calls "
        "without end; turn off for endpoints whose strict mode refuses maxItems",
    )
    # brief by default (issue 55): the fewest answer tokens that keep the seeds' reason
    # per call; its ten words are the length of the seeds' own examples, and only a cap
    # on the reason lets a window's like calls share one entry (docs/performance.md).
    reasoning: Literal["full", "brief", "off"] = Field(
        "brief",
        description="Each call's _reasoningForCall: brief (the default: ten words at most, "
        "as the seeds' examples), full (why the call, unbounded), off (not asked: the "
        "cheapest answer, no reason per call)",
    )
    answer: Literal["compact", "protocol", "keyed"] = Field(
        "compact",
        description="What the model writes: compact (calls grouped per tool, each a "
        "positional array: the fewest output tokens), protocol (one object per call with "
        "_tool, _instance and argument names) or keyed (calls grouped by instance, every "
        "instance's key required: no instance skipped under enforced schemas). Activity "
        "topics get protocol calls either way",
    )
    temperature: float = 0.0
    escalate: SecondModel | None = Field(
        None, description="Second opinions (quality.escalate_on) from this model, alone"
    )
    api_version: str | None = Field(
        None,
        description="Azure OpenAI's api-version; set, base_url is the resource's endpoint, "
        "name the deployment, and the key goes in an api-key header (the AzureOpenAI client)",
    )
    request: RequestShapeSpec | None = Field(
        None,
        description="The request's shape (tokens_param, temperature, response_format); "
        "unset: probed at start with one real request",
    )
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high"] | None = Field(
        None, description="Passed to reasoning models where the endpoint accepts it"
    )
    reasoning_headroom: int = Field(
        2000,
        ge=0,
        description="Tokens added to the output cap for hidden reasoning when the cap is "
        "sent as max_completion_tokens (it bounds reasoning and answer together)",
    )
    timeout_s: float = Field(60.0, gt=0)
    max_output_tokens: int | None = None
    tier: Literal["online", "batch"] = Field(
        "online",
        description="online: each request answered as it is sent; batch: the requests go "
        "out as lines of the provider's Batch API (half price, answered within "
        "batch.completion_window); see docs/batch.md",
    )
    price_input_per_million: float = Field(
        0.0, ge=0, description="USD per million prompt tokens, for the cost-per-item metric"
    )
    price_output_per_million: float = Field(
        0.0, ge=0, description="USD per million completion tokens"
    )
    price_cached_input_per_million: float | None = Field(
        None,
        ge=0,
        description="USD per million prompt tokens the provider served from its prefix "
        "cache; unset: cache.read_factor of the input price, else the input price",
    )
    cache: CacheRule | PresetName = Field(
        default_factory=CacheRule,
        description="The provider's cache rule: a preset's name (openai-0.1x, openai-0.25x, "
        "openai-0.5x, anthropic, no-cache, any-repeat-0.5x; see core/cache_rule.py) or "
        "a rule of its own (read_factor, min_tokens, step_tokens, breakpoints, write_factor)",
    )

    price_batch_factor: float = Field(
        0.5, gt=0, le=1, description="Batch API price / online price (OpenAI, Anthropic: 0.5)"
    )

    @model_validator(mode="after")
    def _one_cached_price(self) -> ModelEndpoint:
        if self.price_cached_input_per_million is not None and self.cache_rule.read_factor:
            raise ValueError(
                "model.price_cached_input_per_million and model.cache's read_factor both "
                "price cached tokens: set one"
            )
        return self

    @property
    def cache_rule(self) -> CacheRule:
        return preset_rule(self.cache) if isinstance(self.cache, str) else self.cache

    def cost_usd(
        self,
        prompt: int,
        completion: int,
        cached: int = 0,
        *,
        written: int = 0,
        batch: bool = False,
        rule: CacheRule | None = None,
    ) -> float:
        """What tokens cost at these prices: cached prompt tokens at the cached price,
        tokens written to a breakpoint cache at its premium. `rule`: bill by that rule
        (a preset) instead of the spec's own, the same tokens priced another way.
        `batch`: tokens of Batch API lines, at `price_batch_factor` of each price.
        The one place a bill is computed: metrics, bench, eval and shadow all call it."""
        rule = rule or self.cache_rule
        cached = min(cached, prompt)
        written = min(written, prompt - cached)
        price = self.price_input_per_million
        if rule.read_factor is not None:
            cached_price = price * rule.read_factor
        elif self.price_cached_input_per_million is not None:
            cached_price = self.price_cached_input_per_million
        else:
            cached_price = price
        online = (
            (prompt - cached - written) * price
            + cached * cached_price
            + written * price * rule.write_factor
            + completion * self.price_output_per_million
        ) / 1_000_000
        return online * self.price_batch_factor if batch else online


class Window(_Strict):
    max_items: int = Field(25, ge=1, le=500, description="Instances per request, at most")
    max_wait_ms: int = Field(250, ge=0)
    max_in_flight: int = Field(
        4, ge=1, le=256, description="Requests in flight per worker, at most (the AIMD ceiling)"
    )
    adaptive: bool = Field(
        True, description="Grow in-flight requests while healthy, shrink on 429s and slowdowns"
    )
    max_input_tokens: int = Field(
        60_000,
        ge=256,
        description="A window closes before its prompt (instructions included) would exceed this",
    )
    max_output_tokens: int | None = Field(
        None,
        ge=64,
        description="A window closes before its expected answer would exceed this; "
        "unset: model.max_output_tokens, else no output budget",
    )
    output_tokens_per_item: int = Field(
        80, ge=1, description="Expected answer tokens per instance until measured"
    )


class AgentSpec(_Strict):
    name: str
    instructions: str
    model: ModelEndpoint = Field(default_factory=ModelEndpoint)
    window: Window = Field(default_factory=Window)
    batch: BatchTier = Field(default_factory=BatchTier)
    tools: list[Tool] = Field(min_length=1)
    advisors: list[Advisor] = Field(default_factory=list)
    advice: AdviceSettings = Field(default_factory=AdviceSettings)
    quality: Quality = Field(default_factory=Quality)
    dedupe: Dedupe = Field(default_factory=Dedupe)
    budget: Budget = Field(default_factory=Budget)
    plan: Plan | None = None
    inputs: list[ContextMessage] = Field(
        default_factory=list, description="Global input messages every instance sees"
    )
    instance_ids: Literal["hidden", "shown"] = Field(
        "hidden",
        description="shown: each instance's message also carries its producer id as `_id` "
        "(ids with meaning: the seeds' employee_B); a call names it by token or shown id",
    )
    accept_state_input: bool = Field(
        False,
        description="true: a `type: state` record on the input topic writes its fields into "
        "its instance's state; false (default): state comes only from the processor's own "
        "turns and awaited results, and such a record is dead-lettered state_input_refused "
        "(anyone who can produce to the input topic could otherwise rewrite any workflow)",
    )
    accept_context_input: bool = Field(
        False,
        description="true: a tool, advisor, plan or global input (no _instance, no key) "
        "record on the input topic is forwarded, in the reading unit's transaction, to the "
        "context topic, and takes effect from there; false (default): it is dead-lettered "
        "context_on_input, naming the context topic (the input topic is written by many "
        "producers, the context topic can have ACLs of its own, and a plan or an advisor "
        "steers every instance)",
    )
    silence: Literal["reask", "no_action"] = Field(
        "reask",
        description="What an instance without any call in a valid answer means: reask "
        "(asked again, then dead-lettered) or no_action (recorded as no action, as the "
        "seeds' manager example leaves employee_A untouched)",
    )

    @model_validator(mode="after")
    def _unique_and_global(self) -> AgentSpec:
        names = [t.name for t in self.tools]
        if dupes := sorted({n for n in names if names.count(n) > 1}):
            raise ValueError(f"tool names must be unique: {dupes}")
        if reserved := sorted({NO_ACTION, CONSULT} & set(names)):
            raise ValueError(f"tool names {reserved} are reserved")
        ids = [a.id for a in self.advisors]
        if len(set(ids)) != len(ids):
            raise ValueError("advisor ids must be unique")
        for advisor in self.advisors:
            _check_advisor_schema(advisor)
        if self.quality.min_agreement is not None and not self.quality.shadow_rate:
            raise ValueError("quality.min_agreement needs quality.shadow_rate > 0 to measure")
        for message in self.inputs:
            if message.instance is not None:
                raise ValueError("spec inputs are global: they must not carry _instance")
        if self.plan is None:
            _check_stateless(self.tools)
        return self

    def advisor(self, advisor_id: str) -> Advisor | None:
        return next((a for a in self.advisors if a.id == advisor_id), None)

    @property
    def on_demand(self) -> list[Advisor]:
        return [a for a in self.advisors if a.on is None]

    def tool(self, name: str) -> Tool | None:
        # Looked up for every call of every answer: a scan per call showed in profiles.
        tools, by_name = self._tools_by_name
        if tools is not self.tools:  # a copy with other tools carries this cache along
            del self.__dict__["_tools_by_name"]
            tools, by_name = self._tools_by_name
        return by_name.get(name)

    @cached_property
    def _tools_by_name(self) -> tuple[list[Tool], dict[str, Tool]]:
        return self.tools, {t.name: t for t in self.tools}


_OPINION_FIELDS = {"id", "calls", "_instance"}


def _check_stateless(tools: list[Tool]) -> None:
    """The seeds: without a Plan message a request is one-shot and stateless, so no
    awaited activity (a latent tool's `_outputPath` goes with the outcome: fine)."""
    if awaited := [t.name for t in tools if t.kind == "activity" and (t.paths or t.output)]:
        raise ValueError(
            f"tools {awaited} declare paths/_output (awaited results written to †state), but "
            "the spec has no plan: without a plan a request is one-shot and stateless (the "
            "seeds), so nothing would ever read the result. Add `plan:` (mode eager or "
            "lazy), or drop paths/_output to make the calls fire-and-forget"
        )


def _check_advisor_schema(advisor: Advisor) -> None:
    where = f"advisor {advisor.id!r}: schema"
    try:
        Draft202012Validator.check_schema(advisor.schema_)
    except SchemaError as exc:
        raise ValueError(f"{where}: not a valid JSON Schema: {exc.message}") from exc
    if advisor.schema_.get("type") != "object":
        raise ValueError(f'{where}: must be a JSON Schema with "type": "object"')
    if clash := sorted(_OPINION_FIELDS & set(advisor.schema_.get("properties", {}))):
        raise ValueError(f"{where}: properties {clash} are reserved for the opinion itself")


def _yaml_on_key(data: dict[Any, Any]) -> dict[Any, Any]:
    """YAML 1.1 reads an unquoted `on:` key as the boolean true; the Advisor protocol
    means the field `on`, so put it back where advisors are declared."""
    advisors = data.get("advisors")
    if isinstance(advisors, list):
        data["advisors"] = [
            {("on" if k is True else k): v for k, v in a.items()} if isinstance(a, dict) else a
            for a in advisors
        ]
    return data


def spec_document(path: Path) -> Any:
    """A spec file's document as written (before `${VAR}` interpolation): what
    schemas/agent-spec.json describes. A SpecError when it cannot be read or parsed."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise SpecError(f"cannot read agent spec {path}: {exc.strerror}", path=str(path)) from exc
    try:
        data = orjson.loads(raw) if path.suffix == ".json" else yaml.safe_load(raw)
    except (orjson.JSONDecodeError, yaml.YAMLError) as exc:
        raise SpecError(_parse_problem(path, exc), path=str(path)) from exc
    return _yaml_on_key(data) if isinstance(data, dict) else data


def _parse_problem(path: Path, exc: Exception) -> str:
    """A parser's error in one line, `file:line:column`, as editors jump to it: the
    parsers' own text is several lines with a caret under the quoted source."""
    if isinstance(exc, orjson.JSONDecodeError):
        return f"agent spec {path}:{exc.lineno}:{exc.colno}: not valid JSON: {exc.msg}"
    mark = getattr(exc, "problem_mark", None)
    if mark is None:
        return f"agent spec {path}: not valid YAML: {' '.join(str(exc).split())}"
    problem = getattr(exc, "problem", None) or "cannot parse"
    context, started = getattr(exc, "context", None), getattr(exc, "context_mark", None)
    where = f" ({context} at line {started.line + 1})" if context and started else ""
    return f"agent spec {path}:{mark.line + 1}:{mark.column + 1}: not valid YAML: {problem}{where}"


def load_spec(path: Path) -> AgentSpec:
    """Read and validate a spec file; every failure is a SpecError naming file and field."""
    data = interpolate(spec_document(path), os.environ, f"agent spec {path}")
    try:
        return AgentSpec.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '(top)'}: {err['msg']}"
            for err in exc.errors()
        )
        raise SpecError(f"agent spec {path} is invalid: {problems}", path=str(path)) from exc
