"""The `stream` entry point catches SIGTERM before it loads the commands, so a SIGTERM
while they load is a clean stop with a line, not Python's silent 143."""

from __future__ import annotations

import signal
import subprocess
import sys
import types
from collections.abc import Iterator

import pytest
from instanced_stream.cli import entry
from instanced_stream.cli.termination import BEFORE_START, Terminated


@pytest.fixture
def own_sigterm() -> Iterator[None]:
    """The entry point installs its SIGTERM handler: the test process gets its own back."""
    before = signal.getsignal(signal.SIGTERM)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


def test_the_entry_point_loads_nothing_heavy_before_its_handler() -> None:
    """What is imported before `main` runs is imported before SIGTERM is caught: the
    commands, the Kafka client and pydantic must not be among it."""
    probe = (
        "import sys, instanced_stream.cli.entry; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('aiokafka', 'pydantic')"
        " or m in ('instanced_stream.cli.main', 'instanced_stream.cli.runner')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"


def test_a_sigterm_while_the_commands_load_is_a_clean_stop(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], own_sigterm: None
) -> None:
    loading = types.ModuleType("instanced_stream.cli.main")

    def main(argv: list[str] | None = None) -> int:
        assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, signal.SIG_IGN)
        raise Terminated()  # as the handler raises it in the middle of an import

    loading.main = main  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "instanced_stream.cli.main", loading)
    assert entry.main([]) == 0
    assert BEFORE_START in capsys.readouterr().err


def test_the_commands_answer_through_it(monkeypatch: pytest.MonkeyPatch, own_sigterm: None) -> None:
    loaded = types.ModuleType("instanced_stream.cli.main")
    loaded.main = lambda argv=None: 7 if argv == ["x"] else 1  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "instanced_stream.cli.main", loaded)
    assert entry.main(["x"]) == 7
