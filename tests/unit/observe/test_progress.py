"""Progress of long commands: a bar on a terminal, plain lines (a tenth at a time) in a
log, and the result lines of a bench either way."""

from __future__ import annotations

import io

from instanced_stream.observe.progress import Progress


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_plain_lines_off_a_terminal_at_most_one_per_tenth() -> None:
    out = io.StringIO()
    with Progress("eval window 10", total=85, stream=out) as progress:
        for _ in range(85):
            progress.advance()
    lines = out.getvalue().splitlines()
    assert 10 <= len(lines) <= 11
    assert all("\r" not in line for line in lines)
    assert lines[-1].startswith("eval window 10: 85/85 items (100%), ")


def test_a_bar_on_a_terminal_and_result_lines_beside_it() -> None:
    out = _Terminal()
    with Progress("bench", None, unit="runs", stream=out) as progress:
        progress.finished("window 50: 4000 items, 177.4 items/s")
        progress.finished("window 100: 4000 items, 201.0 items/s")
    text = out.getvalue()
    assert "\r" in text  # tqdm redraws its line
    assert "bench: window 50: 4000 items, 177.4 items/s\n" in text
    assert "2 runs" in text
    assert progress.done == 2


def test_finished_lines_off_a_terminal() -> None:
    out = io.StringIO()
    progress = Progress("bench", None, unit="runs", stream=out)
    progress.finished("baseline (window 1): 399 items, 13.2 items/s")
    progress.close()
    assert out.getvalue() == "bench: baseline (window 1): 399 items, 13.2 items/s\n"
