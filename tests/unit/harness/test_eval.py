"""What `stream eval` compares: decisions without prose, labels as required arguments."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson
import pytest
from instanced_stream.core.messages import Call
from instanced_stream.core.spec import load_spec
from instanced_stream.llm.client import Completion
from instanced_stream.settings import DEFAULT_SPEC, EXAMPLES
from instanced_stream_bench.harness.eval import (
    EvalItem,
    _right,
    decision_of,
    evaluate,
    load_items,
    markdown,
)
from instanced_stream_bench.testing.sim.account import SimConfig
from instanced_stream_bench.testing.sim.server import Simulator

from tests.fakes import FakeLLM


def _call(tool: str, **args: object) -> Call:
    return Call.model_validate({"_tool": tool, "_instance": "x", **args})


def test_a_decision_keeps_enum_arguments_and_drops_prose() -> None:
    spec = load_spec(DEFAULT_SPEC)
    a = decision_of([_call("moderateComment", decision="reject", reason="rude")], spec)
    b = decision_of(
        [
            _call("moderateComment", decision="reject", reason="insults a person"),
            _call("notifyAuthor", message="Please be kind."),
        ],
        spec,
    )
    assert ("moderateComment", "decision", '"reject"') in a
    assert a != b  # notifying the author is a decision too; its wording is not
    assert b == decision_of(
        [
            _call("moderateComment", decision="reject", reason="other words"),
            _call("notifyAuthor", message="Other words."),
        ],
        spec,
    )
    assert _right(b, {"moderateComment": {"decision": "reject"}})
    assert not _right(b, {"moderateComment": {"decision": "approve"}})
    assert _right(b, {"notifyAuthor": {}}) and not _right(a, {"notifyAuthor": {}})


def test_load_items_strips_underscore_fields_and_names_a_bad_line(tmp_path: Path) -> None:
    good = tmp_path / "good.jsonl"
    good.write_text('{"_instance": "a", "comment": "hi", "_label": {"t": {}}, "_kind": "x"}\n\n')
    [item] = load_items(good)
    assert item.id == "a" and item.payload == {"comment": "hi"} and item.label == {"t": {}}
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"comment": "ok"}\n[1, 2]\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: not a JSON object"):
        load_items(bad)


def test_disagreements_show_items_decided_differently_than_at_window_1() -> None:
    from instanced_stream_bench.harness.eval import EvalItem, SizeReport, disagreements

    spec = load_spec(DEFAULT_SPEC)
    items = [EvalItem("a", {"comment": "fine"}, None), EvalItem("b", {"comment": "rude"}, None)]
    approve = decision_of([_call("moderateComment", decision="approve", reason="x")], spec)
    reject = decision_of([_call("moderateComment", decision="reject", reason="y")], spec)
    one = SizeReport(1, 2, decisions={"a": approve, "b": reject})
    ten = SizeReport(10, 2, decisions={"a": approve, "b": approve})
    text = disagreements([one, ten], items)
    assert "`b`" in text and "`a`" not in text
    assert 'moderateComment.decision="reject"' in text and "window 10" in text
    assert disagreements([one, SizeReport(10, 2, decisions=dict(one.decisions))], items) == ""


class _FirstSeatFlipped(FakeLLM):
    """Decides like the simulator, except that the first item of a request of several
    gets the other decision: an order effect, as BatchPrompt measured on real models."""

    async def complete(
        self,
        messages: list[dict[str, str]],
        response_format: dict[str, Any],
        *,
        items: int = 1,
        max_tokens: int | None = None,
        since: float | None = None,
        keys: tuple[str, ...] = (),
    ) -> Completion:
        done = await super().complete(messages, response_format, items=items)
        if items < 2:
            return done
        answer = orjson.loads(done.text)
        for call in answer["calls"]:
            if call["_instance"] == "①" and "decision" in call:
                call["decision"] = "reject" if call["decision"] == "approve" else "approve"
        return replace(done, text=orjson.dumps(answer).decode())


async def test_permutations_measure_how_often_the_order_changes_a_decision() -> None:
    seed = load_spec(EXAMPLES / "seed_moderation" / "agent.yaml")
    # The fake flips calls in the protocol form's array of calls.
    spec = seed.model_copy(update={"model": seed.model.model_copy(update={"answer": "protocol"})})
    items = [EvalItem(f"i{k}", {"comment": f"note {k}"}, None) for k in range(12)]
    sim = Simulator(SimConfig(classifier=False))
    steady = await evaluate(spec, FakeLLM(sim), items, [4], permutations=2)
    assert steady[1].order_changed == 0.0 and steady[0].order_changed is None
    moved = await evaluate(spec, _FirstSeatFlipped(sim), items, [4], permutations=2)
    changed = moved[1].order_changed
    assert changed is not None and 0 < changed < 1
    assert "decision changed by order" in markdown(moved, "x", "fake")


def test_eval_variants_name_each_run_s_model_settings() -> None:
    """`stream eval --variants`: each comma-separated variant is one run, `+` joins its
    settings, and each is checked as the spec file's model section would be."""
    from instanced_stream.core.spec import load_spec
    from instanced_stream.errors import StreamError
    from instanced_stream.settings import DEFAULT_SPEC
    from instanced_stream_bench import commands

    found = commands.model_variants("answer=protocol+reasoning=off, reasoning=brief")
    assert found == [
        ("answer=protocol+reasoning=off", {"answer": "protocol", "reasoning": "off"}),
        ("reasoning=brief", {"reasoning": "brief"}),
    ]
    spec = load_spec(DEFAULT_SPEC)
    changed = commands.with_model(spec, found[0][1])
    assert (changed.model.answer, changed.model.reasoning) == ("protocol", "off")
    assert changed.tools == spec.tools and spec.model.reasoning == "brief"
    with pytest.raises(StreamError, match="reasoning"):
        commands.with_model(spec, {"reasoning": "long"})
    with pytest.raises(StreamError, match="NAME=VALUE"):
        commands.model_variants("answer")
