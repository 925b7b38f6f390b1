"""`stream check --endpoint` against the simulator as a real account: it answers, knows
one model, accepts one key."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from instanced_stream.cli import main as cli
from instanced_stream_bench.testing.sim.server import Simulator

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


@pytest.fixture
def account(
    simulator: tuple[Simulator, str], monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Simulator, str]]:
    sim, url = simulator
    for name in ("STREAM_LLM_MODEL", "STREAM_LLM_API_KEY", "STREAM_SPEC", "STREAM_WEB_PORT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("STREAM_LLM_BASE_URL", url)
    monkeypatch.setenv("STREAM_LLM_API_KEY", "sk-right")
    previous = sim.config
    sim.config = sim.config.model_copy(update={"api_key": "sk-right"})
    yield sim, url
    sim.config = previous


def test_a_working_endpoint_passes(
    account: tuple[Simulator, str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["check", "--endpoint"]) == 0
    assert "answers, knows model 'stream-sim-1', accepts the key" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"STREAM_LLM_MODEL": "gpt-absent"}, "'gpt-absent'"),
        ({"STREAM_LLM_API_KEY": "sk-wrong"}, "check the API key"),
        ({"STREAM_LLM_BASE_URL": "http://127.0.0.1:1/v1"}, "does not answer"),
    ],
)
def test_a_refusing_or_absent_endpoint_fails_with_one_line(
    account: tuple[Simulator, str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    env: dict[str, str],
    says: str,
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert cli.main(["check", "--endpoint"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0], err
