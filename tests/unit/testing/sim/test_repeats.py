"""The simulator's count of answers asked for again (testing/sim/repeats.py): the same
instance under the same instructions once its answer went out, whatever its place in the
window; a later turn (a new state) or other instructions are new questions."""

from __future__ import annotations

from instanced_stream_bench.testing.sim.repeats import Repeats


def _rows(token: str, comment: str, state: dict[str, str] | None = None) -> list[dict[str, str]]:
    rows = [{"type": "input", "_instance": token, "comment": comment}]
    if state is not None:
        rows.append({"type": "state", "_instance": token, **state})
    return rows


def test_an_instance_answered_again_is_counted_whatever_its_place() -> None:
    repeats = Repeats()
    assert repeats.answered("sys", _rows("i0", "a") + _rows("i1", "b")) == 0
    assert repeats.answered("sys", _rows("i0", "b") + _rows("i1", "c")) == 1


def test_a_next_turn_or_other_instructions_are_new_questions() -> None:
    repeats = Repeats()
    assert repeats.answered("sys", _rows("i0", "a")) == 0
    assert repeats.answered("sys", _rows("i0", "a", {"step": "2"})) == 0
    assert repeats.answered("other sys", _rows("i0", "a")) == 0
    assert repeats.answered("sys", _rows("i3", "a", {"step": "2"})) == 1


def test_past_its_bound_the_oldest_half_is_forgotten() -> None:
    repeats = Repeats(most=4)
    for k in range(5):
        repeats.answered("sys", _rows("i0", str(k)))
    assert repeats.answered("sys", _rows("i0", "0")) == 0  # forgotten
    assert repeats.answered("sys", _rows("i0", "4")) == 1
