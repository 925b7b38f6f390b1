"""The bench's answer figures (harness/paid_twice.py): asks saved from the processors'
logs, answers paid twice from the simulator's count over the run."""

from __future__ import annotations

from pathlib import Path

from instanced_stream_bench.harness.paid_twice import answer_figures, distinct


def test_the_figures_add_every_log_and_take_the_run_s_share_of_the_count(tmp_path: Path) -> None:
    one, two = tmp_path / "p0.log", tmp_path / "p1.log"
    one.write_text("x 3 answers taken from the journal, not asked again\ny\n")
    two.write_text(
        "4 answers taken from the journal, not asked again\n1 answers taken from the journal\n"
    )
    got = answer_figures(
        [one, two, tmp_path / "gone.log"], {"items_asked_again": 2}, {"items_asked_again": 5}
    )
    assert got == {"asks_saved": 8, "answers_paid_twice": 3}


def test_a_run_without_redos_saved_and_paid_nothing(tmp_path: Path) -> None:
    log = tmp_path / "p0.log"
    log.write_text("partition 0: 0 journaled answers to reuse\n")
    assert answer_figures([log], {}, {}) == {"asks_saved": 0, "answers_paid_twice": 0}


def test_distinct_items_differ_in_what_the_model_is_shown() -> None:
    same = {"subject": "Refund", "body": "Please refund me."}
    items = distinct([{**same, "_instance": "t-1"}, {**same, "_instance": "t-2"}])
    shown = [{k: v for k, v in i.items() if k != "_instance"} for i in items]
    assert shown[0] != shown[1] and items[0]["_instance"] == "t-1"
