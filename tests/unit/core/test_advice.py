from __future__ import annotations

import math

import orjson
from hypothesis import example, given
from hypothesis import strategies as st
from instanced_stream.core.advice import Vote, aggregate, parse_votes

Council = list[tuple[str, float, dict[str, int]]]
OPTIONS = ["approve", "reject", "escalate"]
ballots = st.dictionaries(st.sampled_from(OPTIONS), st.integers(0, 100), min_size=1).filter(
    lambda d: sum(d.values()) > 0
)
councils = st.lists(
    st.tuples(st.text(min_size=1, max_size=8), st.floats(0.1, 10), ballots),
    min_size=1,
    max_size=6,
)


def _votes(council: Council) -> list[Vote]:
    out = []
    for advisor, weight, ballot in council:
        shares, error = parse_votes(orjson.dumps(ballot).decode())
        assert error is None and shares is not None
        out.append(Vote(advisor, weight, shares))
    return out


def test_parse_inline_json_votes() -> None:
    assert parse_votes('{"approve": 10, "reject": 90}') == ({"approve": 0.1, "reject": 0.9}, None)
    assert parse_votes('{"approve": "30", "reject": 10}')[0] == {"approve": 0.3, "reject": 0.1}


def test_votes_are_independent_confidence_scores_as_the_seed_writes_them() -> None:
    """The Advisor seed: deploy 10, rollback 5, delay 95 (total 110) keeps its meaning."""
    scores, error = parse_votes('{"deploy": 10, "rollback": 5, "delay": 95}')
    assert error is None and scores == {"deploy": 0.1, "rollback": 0.05, "delay": 0.95}
    seed = aggregate([Vote("analyst", 1.0, scores)])
    assert seed.option == "delay" and math.isclose(seed.score, 0.95)
    # A lone low vote is low confidence, not certainty (it used to count as 1.0).
    lone = aggregate([Vote("a", 1.0, parse_votes('{"approve": 10}')[0] or {})])
    assert lone.option == "approve" and math.isclose(lone.score, 0.1)
    assert parse_votes('{"approve": 0}') == ({"approve": 0.0}, None)  # a real statement


def test_malformed_votes_are_reasons_not_exceptions() -> None:
    for raw in [
        '{"approve": ten}',
        "[1, 2]",
        '{"a": -1}',
        '{"a": 101}',
        "{}",
        42,
        '{"a": "x"}',
        '{"a": 1e999}',
    ]:
        shares, error = parse_votes(raw)
        assert shares is None and error


@given(st.one_of(st.text(), st.binary().map(lambda b: b.decode("latin-1"))))
def test_parse_never_raises(raw: str) -> None:
    shares, error = parse_votes(raw)
    assert (shares is None) != (error is None)
    if shares is not None:
        assert all(0.0 <= v <= 1.0 for v in shares.values())


@given(councils, st.floats(0.1, 100))
# An exact tie (0.285 each) that rounding split one way unscaled and the other scaled.
@example([("0", 3.75, {"reject": 49}), ("0", 3.75, {"approve": 57, "reject": 8})], 1.5)
def test_scaling_every_weight_changes_nothing(council: Council, factor: float) -> None:
    base = aggregate(_votes(council))
    scaled = aggregate(_votes([(a, w * factor, b) for a, w, b in council]))
    assert base.option == scaled.option
    assert math.isclose(base.score, scaled.score, abs_tol=1e-9)
    assert math.isclose(base.divergence, scaled.divergence, abs_tol=1e-9)


@given(councils)
def test_order_of_advisors_does_not_matter(
    council: Council,
) -> None:
    forward = aggregate(_votes(council))
    backward = aggregate(_votes(list(reversed(council))))
    assert forward.option == backward.option
    assert math.isclose(forward.score, backward.score, abs_tol=1e-9)
    assert math.isclose(forward.divergence, backward.divergence, abs_tol=1e-9)


@given(ballots, st.lists(st.floats(0.1, 10), min_size=1, max_size=5))
def test_unanimous_council_has_zero_divergence(
    ballot: dict[str, int], weights: list[float]
) -> None:
    result = aggregate(_votes([(f"a{i}", w, ballot) for i, w in enumerate(weights)]))
    assert math.isclose(result.divergence, 0.0, abs_tol=1e-9)
    assert 0.0 <= result.score <= 1.0


@given(st.floats(1.1, 50))
def test_a_heavier_advisor_pulls_the_consensus(weight: float) -> None:
    council = [("strict", weight, {"reject": 100}), ("lenient", 1.0, {"approve": 100})]
    result = aggregate(_votes(council))
    assert result.option == "reject"
    assert math.isclose(result.score, weight / (weight + 1))
    assert 0 < result.divergence <= 1


@given(councils)
def test_scores_and_divergence_stay_within_0_and_1(council: Council) -> None:
    result = aggregate(_votes(council))
    assert 0.0 <= result.score <= 1.0 and 0.0 <= result.divergence <= 1.0 + 1e-9
    # The consensus score is the mean confidence in its option, never rescaled upwards.
    top = max(max(b.values()) for _, _, b in council) / 100
    assert result.score <= top + 1e-9


def test_opposed_equal_advisors_diverge() -> None:
    result = aggregate(_votes([("a", 1, {"approve": 100}), ("b", 1, {"reject": 100})]))
    assert math.isclose(result.divergence, 0.5)
    assert result.option == "approve"  # ties: alphabetically first, never order-dependent


def test_render_marks_divergence_and_review() -> None:
    from instanced_stream.core.advice import render

    text = render(
        [
            {
                "instance": "c-7",
                "divergent": True,
                "reviewed": ["x"],
                "consulted": [],
                "consensus": {"option": "reject", "score": 0.55, "divergence": 0.45},
                "opinions": [
                    {
                        "advisor": "safetyOfficer",
                        "weight": 2,
                        "votes": {"reject": 0.9, "approve": 0.1},
                        "fields": {"thought": "insulting"},
                    },
                    {
                        "advisor": "communityManager",
                        "weight": 1,
                        "error": "votes are not JSON",
                        "fields": {"tone": "heated"},
                    },
                ],
            }
        ]
    )
    assert "c-7  -> reject (0.55)  DIVERGENT 0.45  1 held for review" in text
    assert "approve=0.10 reject=0.90  insulting" in text
    assert "unusable votes: votes are not JSON" in text
