"""A non-editable install runs its own demo: the wheel built from what the image copies,
installed into a clean venv with the pinned dependencies, run from a folder that is not
this checkout (issue 27, item 1)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]

ROOT = Path(__file__).resolve().parents[2]
# What the Dockerfile's build stage copies: the wheel must need nothing else.
SOURCES = ("pyproject.toml", "setup.py", "README.md", "LICENSE", "instanced_stream", "examples")


def _run(*argv: str | Path, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STREAM_", "OPENAI_"))}
    env.pop("VIRTUAL_ENV", None)
    env.pop("PYTHONPATH", None)
    done = subprocess.run(
        [str(a) for a in argv],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0 or "demo" in argv, f"{argv}: {done.stdout}\n{done.stderr}"
    return done


def build_wheel(sources: tuple[str, ...], project: Path, tmp: Path) -> Path:
    """A wheel built from a copy of `sources` (so nothing is written into the checkout)."""
    tree = tmp / "src"
    for name in sources:
        source = project / name
        if source.is_dir():
            shutil.copytree(source, tree / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            tree.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, tree / name)
    out = tmp / "wheels"
    _run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", out, tree, cwd=tmp)
    (wheel,) = out.glob("*.whl")
    return wheel


def clean_venv(wheel: Path, tmp: Path) -> Path:
    """A new venv with `wheel` and its declared dependencies, pinned by constraints.txt
    (pip's cache serves what ./dev already downloaded)."""
    venv = tmp / "venv"
    _run(sys.executable, "-m", "venv", venv, cwd=tmp)
    pip: list[str | Path] = [venv / "bin" / "python", "-m", "pip", "install", "-q"]
    _run(*pip, "-c", ROOT / "constraints.txt", wheel, cwd=tmp)
    return venv


def test_an_installed_wheel_runs_the_demo_from_anywhere(tmp_path: Path) -> None:
    wheel = build_wheel(SOURCES, ROOT, tmp_path)
    venv = clean_venv(wheel, tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    where = _run(
        venv / "bin" / "python",
        "-c",
        "import instanced_stream; print(instanced_stream.__file__)",
        cwd=elsewhere,
    ).stdout.strip()
    assert where.startswith(str(venv)), where  # the wheel's copy, not this checkout's

    missing = _run(venv / "bin" / "stream", "demo", "--example", "nope", cwd=elsewhere)
    assert missing.returncode == 2
    assert missing.stderr.startswith("stream: error: no example named 'nope'; there are: ")
    assert "moderation" in missing.stderr and "tickets" in missing.stderr

    demo = _run(venv / "bin" / "stream", "demo", "--items", "20", "--json", cwd=elsewhere)
    assert demo.returncode == 0, demo.stderr[-2000:]
    report = orjson.loads(demo.stdout.strip().splitlines()[-1])
    assert report["items"] == 20 and report["unaccounted"] == 0, report
    assert report["example"] == "moderation" and report["dead_letters"] == 4
    assert not list(elsewhere.iterdir()) or all(p.name.startswith(".") for p in elsewhere.iterdir())
