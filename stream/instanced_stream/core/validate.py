"""Checks the model's answer call by call: known tool, known instance, valid arguments.

A refused call never reaches an activity topic; its instance counts as unanswered and is
asked again. Nothing here raises on bad model output: everything becomes data.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import jiter
import orjson
from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

from instanced_stream.core import compact, keyed, plan_graph
from instanced_stream.core.call_meta import STATE
from instanced_stream.core.call_paths import output_path_problem, scopes_problem
from instanced_stream.core.messages import Call
from instanced_stream.core.prompt import Ask, PromptBuilder, meta_tools
from instanced_stream.core.spec import CONSULT, AgentSpec
from instanced_stream.core.strict_form import without_nulls

__all__ = [
    "BAD_PLAN",
    "CROSS_INSTANCE",
    "LATENT_IN_LAZY_PLAN",
    "Opinion",
    "Refusal",
    "Validator",
    "Verdict",
    "input_text",
    "output_path_problem",
    "scopes_problem",
]

_REMEMBERED = 4096  # distinct argument sets whose verdict is kept

# A latent step of a lazy plan answered on the planning turn: nothing latent runs before
# the plan is approved (the seeds' lazy mode).
LATENT_IN_LAZY_PLAN = "latent_in_lazy_plan"

# A call whose argument copies another instance's input text: one item's text decided
# another's call (an injection), refused.
CROSS_INSTANCE = "cross_instance"
_COPY_MIN = 16  # characters: shorter strings ("approve", a name) coincide innocently

# One instance's calls of an answer make no graph that can run: a cycle, or a step that
# reads a path nothing writes (core/plan_graph.py `problem`); the instance is asked again.
BAD_PLAN = "bad_plan"

_META = {"_tool", "_instance", "_outputPath", "_reasoningForCall", "_scopes"}


@dataclass(frozen=True, slots=True)
class Refusal:
    code: str
    reason: str
    call: dict[str, Any] | None
    token: str | None = None


@dataclass(frozen=True, slots=True)
class Opinion:
    """One advisor's opinion as the model wrote it; `token` is None for a batch opinion."""

    advisor: str
    token: str | None
    fields: dict[str, Any]
    votes_raw: Any
    error: str | None = None  # the opinion broke its advisor's schema


@dataclass(slots=True)
class Verdict:
    """Accepted calls per token (in answer order), refused calls, advisors' opinions,
    consult requests per token, and whole-answer failure."""

    calls: dict[str, list[Call]] = field(default_factory=dict)
    refusals: list[Refusal] = field(default_factory=list)
    opinions: list[Opinion] = field(default_factory=list)
    consults: dict[str, list[tuple[str, str]]] = field(default_factory=dict)  # (advisor, question)
    stray_opinions: int = 0
    duplicates: int = 0  # exact repeats of an accepted call, dropped
    cut_short: bool = False  # the answer broke off: only its complete calls were read
    contradicted: set[str] = field(default_factory=set)  # tokens given contradictory calls
    malformed: str | None = None

    def missing(self, tokens: Sequence[str]) -> list[str]:
        return [t for t in tokens if t not in self.calls]


def _salvage(text: str) -> Any:
    """The complete calls of an answer that broke off (the output limit, a dropped
    connection): what the model finished deciding is kept, only the rest is asked again.
    The last call of the array may be cut in the middle of a value, so it is dropped."""
    try:
        answer = jiter.from_json(text.encode(), partial_mode=True)
    except ValueError:
        return None
    calls = answer.get("calls") if isinstance(answer, dict) else None
    if isinstance(calls, dict) and calls:
        # Compact: the last call of the last tool it reached may be cut short.
        last = list(calls)[-1]
        group = calls[last] if isinstance(calls[last], list) else []
        calls = {**calls, last: group[:-1]}
        return {**answer, "calls": calls} if any(calls.values()) else None
    if not isinstance(calls, list):
        return None
    complete = calls[:-1]
    return {**answer, "calls": complete} if complete else None


def _named(raw: Any, shown: Mapping[str, str], known: set[str]) -> Any:
    """`raw` with a shown producer id in `_instance` replaced by its token."""
    if not shown or not isinstance(raw, dict):
        return raw
    name = raw.get("_instance")
    if isinstance(name, str) and name not in known and name in shown:
        return {**raw, "_instance": shown[name]}
    return raw


class Validator:
    def __init__(self, spec: AgentSpec) -> None:
        tools = [*spec.tools, *meta_tools(spec)]
        self._tools = {t.name: t for t in tools}
        self._validators = {t.name: Draft202012Validator(t.parameters) for t in tools}
        self._required = {t.name: set(t.parameters.get("required", [])) for t in tools}
        self._most = {t.name: t.max_calls_per_instance for t in tools}
        self._advisors = {a.id: a for a in spec.advisors}
        self._opinion_validators = {a.id: Draft202012Validator(a.schema_) for a in spec.advisors}
        self._call_fields = PromptBuilder(spec).call_fields
        self._keyed = spec.model.answer == "keyed"
        # `instance_ids: shown`: the model sees each producer id (`_id`) and may name an
        # instance by it (the Instancing seed's manager answers "employee_B").
        self._shown = spec.instance_ids == "shown"
        self._spec = spec
        self._problems: dict[tuple[str, bytes], str | None] = {}

    def check(
        self,
        text: str,
        tokens: Sequence[str],
        ask: Ask | None = None,
        inputs: Mapping[str, str] | None = None,
        names: Mapping[str, str] | None = None,
        states: Mapping[str, dict[str, Any]] | None = None,
    ) -> Verdict:
        """`inputs`: each token's input text as the model saw it, to refuse calls whose
        arguments copy another instance's text (`cross_instance`). `names`: each producer
        id to its token; with `instance_ids: shown` a call or opinion naming a shown id
        means that id's instance. `states`: each token's state as the model saw it, to
        refuse a plan step reading what neither the answer nor the state holds."""
        verdict = Verdict()
        shown = dict(names or {}) if self._shown else {}
        try:
            answer = orjson.loads(text)
        except orjson.JSONDecodeError as exc:
            answer = _salvage(text)
            if answer is None:
                # Its size, not its text: the answer may hold thoughts, never published.
                verdict.malformed = f"answer is not JSON ({exc}); {len(text)} characters"
                return verdict
            verdict.cut_short = True
        calls = answer.get("calls") if isinstance(answer, dict) else None
        if isinstance(calls, dict) and self._keyed:
            calls = keyed.expand(calls, tokens)
        elif isinstance(calls, dict):
            # The compact answer; read back into protocol calls, checked the same way.
            calls = compact.expand(calls, self._call_fields, tokens)
        if not isinstance(calls, list):
            verdict.malformed = 'answer has no "calls" array'
            return verdict
        known = set(tokens)
        ask = ask or Ask()
        for raw in calls:
            raw = _named(raw, shown, known)
            outcome = (
                Refusal("malformed_call", raw.reason, None, _known(raw.token, known))
                if isinstance(raw, compact.Unreadable)
                else self._check_call(raw, known, ask.planning)
            )
            if isinstance(outcome, Refusal):
                verdict.refusals.append(outcome)
            elif outcome.tool == CONSULT:
                if ask.consult:
                    advisor = str(outcome.arguments.get("advisor"))
                    question = str(outcome.arguments.get("question") or "")
                    verdict.consults.setdefault(outcome.instance, []).append((advisor, question))
            elif inputs and (copied := _copied(outcome, inputs)) is not None:
                verdict.refusals.append(Refusal(CROSS_INSTANCE, copied, raw, outcome.instance))
            else:
                self._accept(verdict, outcome, raw)
        for token in verdict.contradicted:
            verdict.calls.pop(token, None)  # neither call wins: the instance is asked again
        if self._spec.plan is not None:
            self._check_plans(verdict, states or {})
        # An instance that asked for a consult is decided in the follow-up, not here.
        for token in verdict.consults:
            verdict.calls.pop(token, None)
        # A lazy plan carrying a latent result broke the protocol: the whole plan of that
        # instance is asked again (a plan with a hole would be proposed otherwise).
        for refusal in verdict.refusals:
            if refusal.code == LATENT_IN_LAZY_PLAN and refusal.token is not None:
                verdict.calls.pop(refusal.token, None)
        raw_opinions = answer.get("advisors", [])
        for raw in raw_opinions if isinstance(raw_opinions, list) else []:
            if isinstance(raw, dict) and "_instance" in raw:  # a number in the compact form
                raw = {**raw, "_instance": compact.token_of(raw["_instance"], tokens)}
            raw = _named(raw, shown, known)
            opinion = self._check_opinion(raw, known, ask)
            if opinion is None:
                verdict.stray_opinions += 1
            else:
                verdict.opinions.append(opinion)
        # A thought is ephemeral: a refusal of one keeps no word of it (its dead letter
        # would publish the text, and its reason may quote it).
        verdict.refusals = [self._unthought(r) for r in verdict.refusals]
        return verdict

    def _check_plans(self, verdict: Verdict, states: Mapping[str, dict[str, Any]]) -> None:
        """Each instance's calls as a graph: one that cannot run is refused as a whole
        (`bad_plan`, with why) and the instance asked again."""
        for token, calls in list(verdict.calls.items()):
            numbered = [(str(k), c) for k, c in enumerate(calls)]
            steps = plan_graph.steps_of(self._spec, numbered, "approved")
            problem = plan_graph.problem(steps, states.get(token) or {})
            if problem is not None:
                verdict.calls.pop(token)
                verdict.refusals.append(Refusal(BAD_PLAN, problem, None, token))

    def _unthought(self, refusal: Refusal) -> Refusal:
        raw = refusal.call
        tool = self._tools.get(str(raw.get("_tool"))) if raw is not None else None
        wrote = raw.get("_outputPath") or raw.get("output") if raw is not None else None
        if raw is None or tool is None or tool.kind != "latent" or wrote:
            return refusal  # not a thought: an output it meant to keep
        kept: dict[str, Any] = {k: raw[k] for k in ("_tool", "_instance") if k in raw}
        why = f"{tool.name}: a thought refused ({refusal.code}); its text is not kept"
        return Refusal(refusal.code, why, kept, refusal.token)

    def _accept(self, verdict: Verdict, call: Call, raw: dict[str, Any]) -> None:
        """A weak model may call one instance twice (approve, then reject): the first
        call counts, the extra ones are refused so nothing contradictory is published.
        Thoughts (latent calls without `_outputPath`) are any number: the seeds' thoughts
        allow multi-step reasoning within one turn, and nothing of them is published."""
        calls = verdict.calls.setdefault(call.instance, [])
        if self._tools[call.tool].kind == "latent" and not call.output_path:
            calls.append(call)
            return
        same = [c for c in calls if c.tool == call.tool]
        if len(same) < self._most[call.tool]:
            calls.append(call)
        elif any(c.arguments == call.arguments for c in same):
            verdict.duplicates += 1  # the same call repeated word for word: nothing to refuse
        else:
            # Contradictory calls: the first no longer wins (an earlier call may be one an
            # item's text injected for this instance); the instance is asked again.
            verdict.contradicted.add(call.instance)
            verdict.refusals.append(
                Refusal(
                    "duplicate_call",
                    f"{call.tool} called for this instance more than {self._most[call.tool]} "
                    "time(s) with different arguments: decide it once, from its own data",
                    raw,
                    call.instance,
                )
            )

    def _check_opinion(self, raw: Any, known: set[str], ask: Ask) -> Opinion | None:
        """An opinion of an active advisor about a known instance, else None (stray)."""
        if not isinstance(raw, dict) or raw.get("id") not in ask.active:
            return None
        advisor = self._advisors[raw["id"]]
        token = raw.get("_instance")
        if advisor.is_instanced and token not in known:
            return None
        fields = {k: v for k, v in raw.items() if k not in ("id", "_instance", "calls")}
        fields = {k: v for k, v in fields.items() if v is not None}
        error = best_match(self._opinion_validators[advisor.id].iter_errors(fields))
        return Opinion(
            advisor=advisor.id,
            token=token if advisor.is_instanced else None,
            fields=fields,
            votes_raw=raw.get("calls"),
            error=None if error is None else f"opinion breaks its schema: {error.message}",
        )

    def _problem(self, tool: str, args: dict[str, Any]) -> str | None:
        """What is wrong with a tool's arguments, remembered per distinct arguments:
        walking the schema was most of the validator's time, and a stream's calls repeat
        the same arguments (approve, "within the rules") over and over."""
        key = (tool, orjson.dumps(args, option=orjson.OPT_SORT_KEYS))
        if key in self._problems:
            return self._problems[key]
        error = best_match(self._validators[tool].iter_errors(args))
        problem = None
        if error is not None:
            path = "/".join(str(p) for p in error.absolute_path) or "(arguments)"
            problem = f"{tool}: {path}: {error.message}"
        if len(self._problems) >= _REMEMBERED:
            self._problems.clear()
        self._problems[key] = problem
        return problem

    def _check_call(self, raw: Any, known: set[str], planning: bool = False) -> Call | Refusal:
        if not isinstance(raw, dict):
            return Refusal("malformed_call", "call is not a JSON object", None)
        tool, token = raw.get("_tool"), raw.get("_instance")
        if token is None and len(known) == 1:
            # The seeds' single-context examples write calls without `_instance`: in a
            # request of one instance there is only one it can mean.
            token = next(iter(known))
            raw = {**raw, "_instance": token}
        where = token if isinstance(token, str) else None
        if not isinstance(tool, str) or tool not in self._validators:
            return Refusal("unknown_tool", f"unknown tool {tool!r}", raw, where)
        if not isinstance(token, str) or token not in known:
            return Refusal("unknown_instance", f"unknown instance {token!r}", raw, None)
        if "output" in raw and raw.get("_outputPath") is None:
            # The seeds write the output path as "output" (the Instancing seed's manager
            # answer: "output": "†state"); json_object mode does not stop the key. Read
            # as `_outputPath` where the tool has no argument of that name, never kept
            # as an argument the tool does not know.
            props = self._tools[tool].parameters.get("properties", {})
            value = raw["output"]
            if "output" not in props:
                if not (isinstance(value, str) and value.strip().startswith(STATE)):
                    return Refusal(
                        "bad_output_path",
                        f'{tool} has no argument "output", and {value!r} is no {STATE} path: '
                        "write where its output goes as _outputPath",
                        raw,
                        token,
                    )
                raw = {k: v for k, v in raw.items() if k != "output"} | {"_outputPath": value}
        required = self._required[tool]
        # Strict output sends optional arguments as null; absent is what the tool means.
        args = {
            k: without_nulls(v, self._tools[tool].parameters.get("properties", {}).get(k))
            for k, v in raw.items()
            if not k.startswith("_") and (v is not None or k in required)
        }
        # A latent call without `_outputPath` is a thought (ephemeral, no step of the
        # plan): on a planning turn it is answered as on any turn, never a broken plan.
        thought = self._tools[tool].kind == "latent" and not raw.get("_outputPath")
        if planning and self._tools[tool].kind == "latent" and not thought:
            if any(v is not None for v in args.values()):
                return Refusal(
                    LATENT_IN_LAZY_PLAN,
                    f"{tool} is a latent step of a lazy plan: plan it with no arguments "
                    "(its _outputPath only); it is answered after the plan is approved",
                    raw,
                    token,
                )
            args = {}  # planned, not answered: its arguments come after approval
        elif (problem := self._problem(tool, args)) is not None:
            return Refusal("bad_arguments", problem, raw, token)
        meta = {k: v for k, v in raw.items() if k in _META and v is not None}
        if "_outputPath" in meta:
            problem = output_path_problem(self._tools[tool], str(meta["_outputPath"]))
            if problem:
                return Refusal("bad_output_path", problem, raw, token)
        if "_scopes" in meta and (problem := scopes_problem(meta["_scopes"])):
            return Refusal("bad_scopes", problem, raw, token)
        try:
            return Call.model_validate({**meta, **args})
        except ValueError as exc:
            return Refusal("malformed_call", f"bad meta property: {exc}", raw, token)


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def input_text(payload: dict[str, Any]) -> str:
    """An instance's text values, for `Validator.check`'s `inputs`."""
    return "\n".join(_strings(payload))


def _copied(call: Call, inputs: Mapping[str, str]) -> str | None:
    """Why the call copies another instance's input text, or None."""
    own = inputs.get(call.instance, "")
    for text in _strings(call.arguments):
        piece = text.strip()
        if len(piece) < _COPY_MIN or piece in own:
            continue
        for token, other in inputs.items():
            if token != call.instance and piece in other:
                return (
                    f"{call.tool} for {call.instance} copies text of instance {token}'s input: "
                    "decide each instance from its own data only"
                )
    return None


def _known(token: str | None, known: set[str]) -> str | None:
    return token if token in known else None
