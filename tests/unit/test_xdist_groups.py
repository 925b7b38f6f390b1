"""`./dev test` runs the suite on four xdist workers and counts on tests/xdist_groups.py's
groups: the real model's tests on one worker, the kills on one, one at a time. pytest 9.2 with
pytest-xdist 3.8 drops the groups without a word (pyproject.toml pins pytest below 9.2);
this runs a small suite the way `./dev test` does and fails if they are dropped again."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_CASES = """
import time

import pytest


@pytest.mark.slow
@pytest.mark.parametrize("k", range(4))
def test_kill(k: int) -> None:
    time.sleep(0.2)


@pytest.mark.local_model
@pytest.mark.parametrize("k", range(3))
def test_model(k: int) -> None:
    time.sleep(0.2)


@pytest.mark.parametrize("k", range(6))
def test_light(k: int) -> None:
    time.sleep(0.2)
"""


def test_the_model_and_the_kills_keep_to_a_worker_each_under_loadgroup(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(
        "from tests.xdist_groups import pytest_collection_modifyitems  # noqa: F401\n"
    )
    (tmp_path / "test_cases.py").write_text(_CASES)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    args = ["-n", "4", "--dist", "loadgroup", "-v", "-p", "no:cacheprovider"]
    args += ["-W", "ignore::pytest.PytestUnknownMarkWarning", "."]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    ran = re.findall(r"\[(gw\d)\] .*PASSED test_cases\.py::(test_\w+)\[\d\](@\w+)?", done.stdout)
    assert len(ran) == 13, done.stdout[-2000:]
    for name, group in (("test_model", "@model"), ("test_kill", "@faults")):
        mine = [(worker, got) for worker, test, got in ran if test == name]
        assert {got for _, got in mine} == {group}, mine
        assert len({worker for worker, _ in mine}) == 1, mine
    light = [group for _, name, group in ran if name == "test_light"]
    assert light == [""] * 6, light
