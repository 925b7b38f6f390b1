"""The bench's answer figures (harness/paid_twice.py): asks saved from the processors'
logs, answers paid twice from the simulator's count over the run."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from instanced_stream_bench.harness import paid_twice
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
    assert got == {"asks_saved": 8, "items_asked_again": 3}


def test_a_run_without_redos_saved_and_paid_nothing(tmp_path: Path) -> None:
    log = tmp_path / "p0.log"
    log.write_text("partition 0: 0 journaled answers to reuse\n")
    assert answer_figures([log], {}, {}) == {"asks_saved": 0, "items_asked_again": 0}


def test_distinct_items_differ_in_what_the_model_is_shown() -> None:
    same = {"subject": "Refund", "body": "Please refund me."}
    items = distinct([{**same, "_instance": "t-1"}, {**same, "_instance": "t-2"}])
    shown = [{k: v for k, v in i.items() if k != "_instance"} for i in items]
    assert shown[0] != shown[1] and items[0]["_instance"] == "t-1"


async def test_a_key_journaled_twice_under_one_edition_is_paid_twice(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Tombstones and a later edition's answer are not a second payment for one answer."""

    @dataclass
    class Rec:
        key: bytes | None
        value: bytes | None

    def entry(edition: str) -> bytes:
        return b'{"edition": "%s", "calls": []}' % edition.encode()

    history = [
        Rec(b"in/0/1/1", entry("e1")),
        Rec(b"in/0/1/1", b""),  # its outcome committed
        Rec(b"in/0/2/1", entry("e1")),
        Rec(b"in/0/2/1", entry("e1")),  # a redo asked again
        Rec(b"in/0/3/1", entry("e1")),
        Rec(b"in/0/3/1", entry("e2")),  # the spec changed before the redo
        Rec(None, entry("e1")),
    ]

    async def read(bootstrap: str, topic: str) -> AsyncIterator[Rec]:
        for rec in history:
            yield rec

    monkeypatch.setattr(paid_twice, "read_topic", read)
    assert await paid_twice.journaled_twice("unused:9092", "journal") == 1
