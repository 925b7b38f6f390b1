"""The test-only fault injector: what STREAM_CRASH_AT accepts and when a point fires."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest
from instanced_stream.settings import Settings
from instanced_stream_bench.testing import faults
from instanced_stream_bench.testing.faults import InjectedFault, arm, crash_point, parse
from pydantic import ValidationError


@pytest.fixture(autouse=True)
def _disarmed() -> Iterator[None]:
    yield
    arm(None)


def test_parse_reads_kill_raise_and_onwards() -> None:
    assert parse("after_llm:3") == ("after_llm", 3, True, False)
    assert parse("raise:mid_commit:1") == ("mid_commit", 1, False, False)
    assert parse("raise:solved:2+") == ("solved", 2, False, True)


@pytest.mark.parametrize(
    "bad",
    ["", "after_llm", "after_lmm:1", "after_llm:0", "after_llm:x", "raise:after_llm", "a:b:c:d"],
)
def test_parse_refuses_what_would_never_fire(bad: str) -> None:
    with pytest.raises(ValueError, match="crash point"):
        parse(bad)


def test_a_process_is_killed_once_only() -> None:
    with pytest.raises(ValueError, match="killed only once"):
        parse("after_llm:2+")


def test_settings_validate_the_crash_point(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAM_CRASH_AT", "after_commit:2")
    assert Settings().crash_at == "after_commit:2"
    monkeypatch.setenv("STREAM_CRASH_AT", "before_everything:1")
    with pytest.raises(ValidationError, match="crash point"):
        Settings()
    monkeypatch.delenv("STREAM_CRASH_AT")
    assert Settings().crash_at is None


def test_unarmed_points_do_nothing() -> None:
    arm(None)
    for point in faults.POINTS:
        crash_point(point)
    assert not faults.armed("after_llm")


def test_raise_fires_at_the_nth_pass_of_its_own_point_only() -> None:
    arm("raise:after_llm:3")
    assert faults.armed("after_llm") and not faults.armed("after_commit")
    crash_point("after_commit")  # another point: not counted
    crash_point("after_llm")
    crash_point("after_llm")
    with pytest.raises(InjectedFault, match="after_llm"):
        crash_point("after_llm")
    crash_point("after_llm")  # only the 3rd


def test_raise_onwards_fires_every_time_from_n() -> None:
    arm("raise:solved:2+")
    crash_point("solved")
    for _ in range(3):
        with pytest.raises(InjectedFault):
            crash_point("solved")


def test_kill_mode_sigkills_the_process() -> None:
    code = (
        "from instanced_stream_bench.testing.faults import arm, crash_point\n"
        "arm('mid_commit:2')\n"
        "crash_point('mid_commit')\n"
        "print('survived the first pass', flush=True)\n"
        "crash_point('mid_commit')\n"
        "print('survived the second pass', flush=True)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == -signal.SIGKILL
    assert done.stdout.splitlines() == ["survived the first pass"]
