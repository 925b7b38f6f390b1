from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from instanced_stream.core.instance import Instance
from instanced_stream.core.messages import SourcePosition
from instanced_stream.core.prompt import Ask, PromptBuilder, token_for
from instanced_stream.core.spec import AgentSpec, load_spec
from instanced_stream.errors import SpecError
from instanced_stream.settings import DEFAULT_SPEC, EXAMPLES


def _inst(i: int, text: str) -> Instance:
    src = SourcePosition(topic="items", partition=0, offset=i)
    return Instance(id=f"producer-id-{i}", payload={"comment": text}, source=src, size=40)


def test_example_spec_loads_with_its_council_and_room_for_a_plan() -> None:
    spec = load_spec(DEFAULT_SPEC)
    assert [t.name for t in spec.tools] == ["moderateComment", "notifyAuthor"]
    assert [(a.id, a.on, a.is_instanced, a.weight) for a in spec.advisors] == [
        ("safetyOfficer", "request", True, 2.0),
        ("communityManager", "start", False, 1.0),
        ("legalCounsel", None, True, 1.5),
    ]
    assert spec.plan is None


def test_bad_spec_names_the_field(tmp_path: Path) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text(
        "name: x\ninstructions: y\ntools:\n  - name: t\n    description: d\n"
        "    parameters: {type: string}\n"
    )
    with pytest.raises(SpecError, match=r"tools\.0\.parameters"):
        load_spec(path)


def test_reserved_tool_name_refused() -> None:
    with pytest.raises(ValueError, match="reserved"):
        AgentSpec.model_validate(
            {"name": "x", "instructions": "y", "tools": [{"name": "NoAction", "description": "d"}]}
        )


def test_tokens_are_positional_and_compact() -> None:
    assert [token_for(k) for k in range(3)] == ["①", "②", "③"]
    assert len({token_for(k) for k in range(120)}) == 120


def test_prompt_hides_producer_ids_and_keeps_static_prefix() -> None:
    builder = PromptBuilder(load_spec(DEFAULT_SPEC))
    first = builder.messages([_inst(0, "hello"), _inst(1, "world")])
    second = builder.messages([_inst(7, "other"), _inst(8, "batch")])
    assert first[0] == second[0]  # byte-identical system prefix: cacheable
    body = orjson.loads(first[1]["content"])
    assert [m["_instance"] for m in body] == [1, 2]  # the compact form numbers instances
    assert "producer-id" not in first[1]["content"]
    assert "policy" in first[0]["content"]  # global input sits in the static prefix


def test_schema_depends_only_on_batch_size_and_enumerates_tokens_and_tools() -> None:
    builder = PromptBuilder(load_spec(DEFAULT_SPEC))
    fmt = builder.response_format(3)
    assert fmt is builder.response_format(3)  # cached: providers compile it once
    calls = fmt["json_schema"]["schema"]["properties"]["calls"]
    tools = ["moderateComment", "notifyAuthor", "NoAction", "ConsultAdvisor"]
    assert list(calls["properties"]) == tools == calls["required"]
    assert calls["additionalProperties"] is False
    token = {"type": "integer", "enum": [1, 2, 3]}
    for group in calls["properties"].values():
        assert token in group["items"]["items"]["anyOf"]
        assert group["maxItems"] == 3  # one call per instance at most, per tool
    assert fmt["json_schema"]["strict"] is True


def test_protocol_answer_schema_enumerates_tokens_and_tools_per_call() -> None:
    spec = load_spec(DEFAULT_SPEC)
    spec = spec.model_copy(update={"model": spec.model.model_copy(update={"answer": "protocol"})})
    fmt = PromptBuilder(spec).response_format(3)
    branches = fmt["json_schema"]["schema"]["properties"]["calls"]["items"]["anyOf"]
    assert {b["properties"]["_tool"]["enum"][0] for b in branches} == {
        "moderateComment",
        "notifyAuthor",
        "NoAction",
        "ConsultAdvisor",
    }
    assert all(b["properties"]["_instance"]["enum"] == ["①", "②", "③"] for b in branches)
    assert fmt["json_schema"]["strict"] is True


def test_invalid_advisor_is_refused_naming_advisor_and_field(tmp_path: Path) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text(
        "name: x\ninstructions: y\ntools: [{name: t, description: d}]\n"
        "advisors:\n  - id: riskAnalyst\n    role: r\n    on: request\n"
        "    schema: {type: object, properties: {calls: {type: string}}}\n"
    )
    with pytest.raises(SpecError, match=r"advisor 'riskAnalyst': schema: .*calls.* reserved"):
        load_spec(path)
    path.write_text(
        "name: x\ninstructions: y\ntools: [{name: t, description: d}]\n"
        "advisors:\n  - {id: a1, role: r, on: sometimes}\n"
    )
    with pytest.raises(SpecError, match=r"advisors\.0\.on"):
        load_spec(path)


def test_advisors_come_before_calls_and_only_active_ones_speak() -> None:
    spec = load_spec(DEFAULT_SPEC)
    builder = PromptBuilder(spec)
    schema = builder.response_format(2)["json_schema"]["schema"]
    assert list(schema["properties"]) == ["advisors", "calls"]
    assert schema["required"] == ["advisors", "calls"]
    opinions = {
        b["properties"]["id"]["enum"][0]: b
        for b in schema["properties"]["advisors"]["items"]["anyOf"]
    }
    assert set(opinions) == {"safetyOfficer", "communityManager"}  # on: null stays silent
    assert opinions["safetyOfficer"]["properties"]["_instance"]["enum"] == [1, 2]
    assert "_instance" not in opinions["communityManager"]["properties"]
    assert list(opinions["safetyOfficer"]["properties"])[-1] == "calls"
    follow = Ask(("safetyOfficer", "communityManager", "legalCounsel"), consult=False)
    later = builder.response_format(2, follow)["json_schema"]["schema"]
    ids = {
        b["properties"]["id"]["enum"][0] for b in later["properties"]["advisors"]["items"]["anyOf"]
    }
    assert "legalCounsel" in ids
    assert "ConsultAdvisor" not in later["properties"]["calls"]["properties"]  # bounded
    control = orjson.loads(builder.messages([_inst(0, "x")], follow)[-1]["content"])
    assert control["activeAdvisors"] == list(follow.active) and not control["mayConsult"]
    # Why each speaks now, told to the model (the seeds' `on`)
    assert control["why"]["legalCounsel"].startswith("consulted")
    assert control["why"]["safetyOfficer"].startswith("on: request")
    assert "# Advisors" in builder.system
    assert '"scopes":["input.comment"]' in builder.system  # soft focus, nothing hidden
    assert "weighs its scopes first" in builder.system


def test_what_changes_per_batch_goes_after_the_same_system_prefix() -> None:
    """#38's prompt additions (the eager order sentence, pageOnCall, advisors' weights and
    what they mean) are static: a later turn's state, plan statuses and rejected versions,
    and a re-ask's `heard` opinions, go after a system message of the same bytes."""
    tickets = load_spec(EXAMPLES / "tickets" / "agent.yaml")
    builder = PromptBuilder(tickets)
    first = builder.messages([_inst(0, "my site is down")], builder.ask_for(1))
    later = Instance(
        id="producer-id-1",
        payload={"comment": "still down"},
        source=SourcePosition(topic="items", partition=0, offset=1),
        size=40,
        state={"urgent": {"why": "outage"}},
        turn=2,
        plan=[{"tool": "pageOnCall", "status": "skipped", "skippedFor": "branch"}],
        rejected=[{"proposal_id": "p-1", "reason": "page later"}],
    )
    second = builder.messages([later], builder.ask_for(2, replanning=True))
    assert "pageOnCall" in first[0]["content"] and "urgent" in second[1]["content"]
    assert first[0] == second[0] and PromptBuilder(tickets).system == first[0]["content"]
    council = PromptBuilder(load_spec(DEFAULT_SPEC))
    asked = council.messages([_inst(2, "hello")])
    heard = [{"id": "communityManager", "calls": '{"approve": 70}'}]
    again = council.messages([_inst(3, "world")], council.ask_for(2), heard=heard)
    assert '"weight":2.0' in asked[0]["content"] and '"heard"' in again[-1]["content"]
    assert asked[0] == again[0]


def _window(partition: int, first: int, texts: list[str]) -> list[Instance]:
    return [
        Instance(
            id=f"user-comment-{partition}-{first + k}",
            payload={"comment": text},
            source=SourcePosition(topic="items", partition=partition, offset=first + k),
            size=len(text),
        )
        for k, text in enumerate(texts)
    ]


def test_windows_of_two_processors_share_their_prefix_byte_for_byte() -> None:
    """What windows share comes first and is the same bytes whichever processor built the
    request (each loads the spec file and builds its own edition) and whichever items,
    partitions and window size it holds: a provider's prefix cache hits across them."""
    from instanced_stream.core.live_spec import Edition

    one, two = (Edition.of(1, load_spec(DEFAULT_SPEC)) for _ in range(2))
    a = _window(0, 0, ["Thanks!", "You idiot.", "BUY NOW www.spam.test"])
    b = _window(3, 9120, [f"Comment number {k}, quite fine." for k in range(7)])
    first, second = one.prompt.messages(a), two.prompt.messages(b)
    assert first[0]["role"] == second[0]["role"] == "system"
    shared = first[0]["content"]
    assert orjson.dumps(first[0]) == orjson.dumps(second[0])
    # All that windows share is in it, the instructions first ...
    spec = one.spec
    assert shared.startswith(spec.instructions.strip())
    for tool in spec.tools:
        assert f'"name":"{tool.name}"' in shared
    for advisor in spec.advisors:
        assert f'"id":"{advisor.id}"' in shared
    assert "Community rules v3" in shared  # the global input
    assert '"call":[' in shared  # the compact answer's layout of each tool's calls
    # ... and nothing of a window: its items, their ids and positions come after it.
    for inst in [*a, *b]:
        assert inst.payload["comment"] not in shared and inst.id not in shared
    assert all(m["role"] == "user" for m in first[1:] + second[1:])
    # The answer's schema: the same bytes for windows of one size, from either processor.
    for n in (3, 7, 50):
        assert orjson.dumps(one.prompt.response_format(n)) == orjson.dumps(
            two.prompt.response_format(n)
        )
