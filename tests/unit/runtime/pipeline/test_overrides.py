from __future__ import annotations

from types import SimpleNamespace

import orjson
import pytest
from aiokafka import TopicPartition
from instanced_stream.core.overrides import apply_overrides
from instanced_stream.core.spec import AgentSpec, load_spec
from instanced_stream.runtime.pipeline.overrides import OverrideFollower
from instanced_stream.settings import DEFAULT_SPEC

from tests.flows import TICKETS


def _msg(data: object) -> bytes:
    return orjson.dumps(data)


def test_context_advisors_and_inputs_merge_and_bad_ones_are_refused_by_name() -> None:
    spec = load_spec(DEFAULT_SPEC)
    messages: dict[str, bytes | None] = {
        "brandGuardian": _msg(
            {
                "type": "advisor",
                "id": "brandGuardian",
                "role": "Guard the brand",
                "on": "request",
                "weight": 0.5,
            }
        ),
        "safetyOfficer": _msg(
            {
                "type": "advisor",
                "id": "safetyOfficer",
                "role": "stricter now",
                "on": "request",
                "isInstanced": True,
                "weight": 3,
            }
        ),
        "brokenAdvisor": _msg(
            {"type": "advisor", "id": "brokenAdvisor", "role": "r", "on": "always"}
        ),
        "badSchema": _msg(
            {
                "type": "advisor",
                "id": "badSchema",
                "role": "r",
                "on": "start",
                "schema": {"type": "array"},
            }
        ),
        "season": _msg({"type": "input", "note": "holiday season: expect more spam"}),
        "targeted": _msg({"type": "input", "_instance": "c-1", "note": "not global"}),
        "garbage": b"{nope",
        "removed": None,
    }
    merged, refused = apply_overrides(spec, messages)
    ids = [a.id for a in merged.advisors]
    assert "brandGuardian" in ids and "brokenAdvisor" not in ids and "badSchema" not in ids
    assert merged.advisor("safetyOfficer") is not None
    assert merged.advisor("safetyOfficer").weight == 3  # type: ignore[union-attr]
    assert any(
        m.model_extra and m.model_extra.get("note", "").startswith("holiday") for m in merged.inputs
    )
    reasons = dict(refused)
    assert set(reasons) == {"brokenAdvisor", "badSchema", "targeted", "garbage"}
    assert "brokenAdvisor" in reasons["brokenAdvisor"] and ".on" in reasons["brokenAdvisor"]
    assert "advisor 'badSchema': schema" in reasons["badSchema"]
    assert "not JSON" in reasons["garbage"]


def test_no_context_leaves_the_spec_as_it_was() -> None:
    spec = load_spec(DEFAULT_SPEC)
    merged, refused = apply_overrides(spec, {})
    assert merged == spec and refused == []


def test_a_context_change_that_fails_to_install_leaves_the_running_one_as_it_was() -> None:
    spec = load_spec(DEFAULT_SPEC)
    installed: list[AgentSpec] = []

    base_inputs = len(spec.inputs)

    def install(new: AgentSpec, refused: object) -> None:
        if len(new.inputs) > base_inputs + 1:
            raise RuntimeError("cannot install")  # e.g. a budget the new spec cannot meet
        installed.append(new)

    follower = OverrideFollower("unused:9092", "ctx", spec, {}, {}, install)
    tp = TopicPartition("ctx", 0)

    def rec(key: str, value: dict[str, object]) -> SimpleNamespace:
        return SimpleNamespace(key=key.encode(), value=orjson.dumps(value))

    follower._apply({tp: [rec("g1", {"type": "input", "tone": "kind"})]})
    assert len(installed) == 1 and set(follower.messages) == {"g1"}
    assert len(installed[0].inputs) == base_inputs + 1
    with pytest.raises(RuntimeError):
        follower._apply({tp: [rec("g2", {"type": "input", "tone": "strict"})]})
    assert set(follower.messages) == {"g1"}  # the failed change left no trace
    assert len(installed) == 1


def test_a_context_advisor_written_as_the_seed_writes_it_registers() -> None:
    """The Advisor seed's Russian text: `kind: "advisor"` and a Cyrillic id."""
    seed = {
        "kind": "advisor",
        "id": "аналитикРисков",
        "on": "request",
        "scopes": ["†state.deploymentHistory"],
        "role": "Анализировать риски и голосовать за действия по развёртыванию.",
    }
    merged, refused = apply_overrides(load_spec(DEFAULT_SPEC), {"аналитикРисков": _msg(seed)})
    assert refused == []
    assert merged.advisor("аналитикРисков") is not None


def test_a_context_plan_replaces_the_specs_plan() -> None:
    spec = load_spec(TICKETS)
    assert spec.plan is not None and spec.plan.mode == "eager"
    merged, refused = apply_overrides(spec, {"plan": _msg({"type": "plan", "mode": "lazy"})})
    assert refused == [] and merged.plan is not None and merged.plan.mode == "lazy"
    # the seeds' other spelling of the kind
    merged, refused = apply_overrides(spec, {"plan": _msg({"kind": "plan", "maxTurns": 2})})
    assert refused == [] and merged.plan is not None and merged.plan.max_turns == 2


def test_a_context_plan_for_a_stateless_spec_is_refused_with_the_reason() -> None:
    spec = load_spec(DEFAULT_SPEC)
    assert spec.plan is None
    merged, refused = apply_overrides(spec, {"plan": _msg({"type": "plan"})})
    assert merged.plan is None
    ((key, why),) = refused
    assert key == "plan" and "has none" in why and "restart" in why


def test_a_context_tool_replaces_a_declared_one_or_adds_a_latent_one() -> None:
    spec = load_spec(DEFAULT_SPEC)
    first = spec.tools[0].model_dump(by_alias=True)
    changed = {**first, "description": "moderate, kindly"}
    thought = {"type": "tool", "name": "ponder", "kind": "latent", "description": "think"}
    stranger = {"kind": "tool", "name": "sendMail", "description": "mail someone"}
    merged, refused = apply_overrides(
        spec,
        {first["name"]: _msg(changed), "ponder": _msg(thought), "sendMail": _msg(stranger)},
    )
    assert merged.tool(first["name"]).description == "moderate, kindly"  # type: ignore[union-attr]
    assert merged.tool("ponder") is not None and merged.tool("sendMail") is None
    ((key, why),) = refused
    assert key == "sendMail" and "add it to the spec" in why
