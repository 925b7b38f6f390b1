"""The `stream` entry point catches SIGTERM before it loads the commands, so a SIGTERM
while they load is a clean stop with a line, not Python's silent 143; and while a start
runs the handler only records it, so no exception is raised into an import (orjson's
initialisation crashed with one: SIGSEGV) or into Python code called from C (lost there,
and the process never stopped)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import types
from collections.abc import Iterator

import pytest
from instanced_stream import termination
from instanced_stream.cli import entry
from instanced_stream.termination import BEFORE_START, Terminated


@pytest.fixture
def own_sigterm(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The entry point installs its SIGTERM handler: the test process gets its own back,
    and no request recorded here outlives the test."""
    before = signal.getsignal(signal.SIGTERM)
    monkeypatch.setattr(termination._Request, "asked", False)
    monkeypatch.setattr(termination._Request, "unwinding", False)
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
        raise Terminated(before_start=True)  # as a safe point of the start raises it

    loading.main = main  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "instanced_stream.cli.main", loading)
    assert entry.main([]) == 0
    assert BEFORE_START in capsys.readouterr().err


def test_the_commands_answer_through_it(monkeypatch: pytest.MonkeyPatch, own_sigterm: None) -> None:
    loaded = types.ModuleType("instanced_stream.cli.main")
    loaded.main = lambda argv=None: 7 if argv == ["x"] else 1  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "instanced_stream.cli.main", loaded)
    assert entry.main(["x"]) == 7


def test_a_sigterm_while_the_commands_load_lets_the_import_finish_then_stops(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], own_sigterm: None
) -> None:
    """The signal comes in the middle of the module's initialisation: the initialisation
    runs to its end (nothing is raised into it), and the start stops right after it."""
    steps: list[str] = []
    loading = types.ModuleType("instanced_stream.cli.main")

    def main(argv: list[str] | None = None) -> int:
        steps.append("parsed")
        return 0

    class _Finder:
        """Imports `instanced_stream.cli.main` as a module whose body gets a SIGTERM."""

        @staticmethod
        def find_spec(name: str, path: object, target: object = None) -> object:
            if name != "instanced_stream.cli.main":
                return None
            import importlib.machinery

            return importlib.machinery.ModuleSpec(name, _Finder)  # type: ignore[arg-type]

        @staticmethod
        def create_module(spec: object) -> types.ModuleType:
            return loading

        @staticmethod
        def exec_module(module: types.ModuleType) -> None:
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(1000):  # the handler runs between these bytecodes
                steps.append("init")
            module.main = main  # type: ignore[attr-defined]
            steps.append("initialised")

    monkeypatch.delitem(sys.modules, "instanced_stream.cli.main", raising=False)
    monkeypatch.setattr(sys, "meta_path", [_Finder, *sys.meta_path])
    assert entry.main([]) == 0
    assert steps[-1] == "initialised" and steps.count("init") == 1000, steps[-3:]
    assert BEFORE_START in capsys.readouterr().err


def test_once_unwinding_a_sigterm_raises_at_once_and_a_recorded_one_raises_on_entry(
    own_sigterm: None,
) -> None:
    termination.defer_sigterm()
    os.kill(os.getpid(), signal.SIGTERM)
    assert termination.asked()
    with pytest.raises(Terminated) as recorded:
        termination.unwind_on_sigterm()
    assert recorded.value.before_start
    termination._Request.asked = False
    termination.unwind_on_sigterm()
    with pytest.raises(Terminated) as raised:
        _signalled()
    assert not raised.value.before_start
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN  # the clean-up runs once


def _signalled() -> None:
    """SIGTERM to this process, then bytecodes for its handler to run between."""
    os.kill(os.getpid(), signal.SIGTERM)
    for _ in range(10_000):
        pass
