"""The product against the simulator playing OpenAI (`--provider openai`) with a GPT-5
family model: the start-up probe finds the request shape it accepts, the demo's items all
end where they should, and a shape the spec forces and the endpoint refuses pauses the
stream with the provider's words and dead-letters nothing (until the endpoint takes it)."""

from __future__ import annotations

import asyncio
import os
import secrets
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
import yaml
from instanced_stream.core.messages import ITEM_CODES
from instanced_stream.kafka.topics import read_json
from instanced_stream.settings import DEFAULT_SPEC
from instanced_stream_bench.harness.demo import (
    ProcessorProcess,
    launch_processor,
    produce,
    wait_accounted,
)
from instanced_stream_bench.testing.samples import malformed_records
from instanced_stream_bench.testing.sim.account import MODEL_NAME, SimConfig
from instanced_stream_bench.testing.sim.server import Simulator, running_simulator

from tests.conftest import _free_port, demo_json

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

MODEL = "gpt-5-mini"
REFUSED_WORDS = "Use 'max_completion_tokens' instead."


@pytest.fixture(scope="module")
def openai_sim() -> Iterator[tuple[Simulator, str]]:
    with running_simulator(SimConfig(provider="openai")) as sim:
        yield sim


def _stream(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("STREAM_", "OPENAI_"))}
    return subprocess.run(
        [sys.executable, "-m", "instanced_stream", *args],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_check_endpoint_probes_and_prints_the_shape_a_gpt5_model_takes(
    openai_sim: tuple[Simulator, str],
) -> None:
    sim, url = openai_sim
    before, probes = sim.stats["refused_shape"], sim.stats["probes"]
    done = _stream("check", "--endpoint", STREAM_LLM_BASE_URL=url, STREAM_LLM_MODEL=MODEL)
    assert done.returncode == 0, done.stderr
    shape = [line for line in done.stdout.splitlines() if line.startswith("request shape")]
    assert shape == [
        "request shape (probed): max_completion_tokens, no temperature, "
        "response_format json_schema_strict"
    ], done.stdout
    assert REFUSED_WORDS in done.stdout  # what was refused on the way, in its words
    assert sim.stats["refused_shape"] - before == 2  # max_tokens, then temperature
    assert sim.stats["probes"] - probes == 1  # the accepted probe, counted apart
    last = sim.bodies[-1]
    assert "max_tokens" not in last and "temperature" not in last
    assert last["response_format"]["json_schema"]["strict"] is True


def test_openai_base_url_and_key_are_read_as_the_openai_client_reads_them(
    openai_sim: tuple[Simulator, str],
) -> None:
    sim, url = openai_sim
    previous = sim.config
    sim.config = sim.config.model_copy(update={"api_key": "sk-env"})
    try:
        done = _stream(
            "check",
            "--endpoint",
            OPENAI_BASE_URL=url,
            OPENAI_API_KEY="sk-env",
            STREAM_LLM_MODEL=MODEL,
        )
        assert done.returncode == 0, done.stderr
        assert f"endpoint {url}: answers" in done.stdout
        # STREAM_LLM_BASE_URL wins over OPENAI_BASE_URL.
        done = _stream(
            "check",
            "--endpoint",
            OPENAI_BASE_URL="http://127.0.0.1:1/v1",
            STREAM_LLM_BASE_URL=url,
            OPENAI_API_KEY="sk-env",
            STREAM_LLM_MODEL=MODEL,
        )
        assert done.returncode == 0, done.stderr
        done = _stream(
            "check",
            "--endpoint",
            OPENAI_BASE_URL=url,
            OPENAI_API_KEY="sk-wrong",
            STREAM_LLM_MODEL=MODEL,
        )
        assert done.returncode == 2 and "check the API key" in done.stderr
        assert "sk-wrong" not in done.stderr + done.stdout  # a key is never printed
    finally:
        sim.config = previous


def test_the_demo_against_a_gpt5_model_accounts_for_every_item(
    bootstrap: str, openai_sim: tuple[Simulator, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    sim, url = openai_sim
    monkeypatch.setenv("STREAM_LLM_MODEL", MODEL)
    answered = sim.stats["completions"]
    summary = demo_json(bootstrap, "--llm", url, "--items", "60", timeout=200)
    malformed = len(malformed_records(256_000))
    assert summary["unaccounted"] == 0, summary
    assert summary["dead_letters"] == malformed, summary
    assert set(summary["dead_letter_codes"]) <= ITEM_CODES - {"llm_rejected", "llm_error"}
    assert "llm_rejected" not in summary["dead_letter_codes"]
    assert sim.stats["completions"] > answered
    assert summary["llm"]["model"] == MODEL


def _forced_spec(tmp: Path) -> Path:
    spec = yaml.safe_load(DEFAULT_SPEC.read_text())
    spec["model"]["request"] = {"tokens_param": "max_tokens", "temperature": "omit"}
    path = tmp / "agent.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


async def _said(proc: ProcessorProcess, words: str, wait_s: float) -> None:
    """Until the processor's log holds `words` (a log file has no event to await)."""
    deadline = time.monotonic() + wait_s
    for _ in range(int(wait_s)):
        if words in proc.tail(400) or time.monotonic() > deadline:
            return
        await asyncio.sleep(1)


def _metric(web: str, name: str) -> float | None:
    with urllib.request.urlopen(f"{web}/metrics", timeout=5) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
    return None


async def test_a_forced_shape_the_endpoint_refuses_pauses_and_dead_letters_nothing(
    bootstrap: str, openai_sim: tuple[Simulator, str], tmp_path: Path
) -> None:
    sim, url = openai_sim
    port = _free_port()
    settings, spec, proc = await launch_processor(
        bootstrap,
        url,
        f"t{secrets.token_hex(4)}.",
        "stream-test-",
        _forced_spec(tmp_path),
        STREAM_LLM_MODEL=MODEL,
        STREAM_WEB_HOST="127.0.0.1",
        STREAM_WEB_PORT=str(port),
    )
    web = f"http://127.0.0.1:{port}"
    try:
        items = [{"_instance": f"c-{k}", "comment": f"a kind comment {k}"} for k in range(12)]
        await produce(
            bootstrap,
            settings.topics.input,
            [(i["_instance"].encode(), orjson.dumps(i)) for i in items],
        )
        await _said(proc, REFUSED_WORDS, 90)
        await asyncio.sleep(5)  # retries go on meanwhile: none may dead-letter anything
        log = proc.tail(400)
        errors = [line for line in log.splitlines() if "ERROR" in line and REFUSED_WORDS in line]
        assert len(errors) == 1, log
        assert "request's shape" in errors[0]
        assert _metric(web, 'instanced_stream_llm_refused_total{status="400"}') == 1
        assert _metric(web, "instanced_stream_llm_refusing") == 1
        assert await read_json(bootstrap, settings.topics.dead_letter) == []
        assert await read_json(bootstrap, settings.topics.activity("moderateComment")) == []
        # The endpoint takes the shape now (as after a model change): the paused items
        # are answered, and still nothing was dead-lettered.
        sim.config = sim.config.model_copy(update={"provider": "generic", "model": MODEL})
        report = await wait_accounted(bootstrap, settings, spec, len(items), 90, proc)
        assert report.unaccounted == 0 and report.dead_letters == {}, report
        assert _metric(web, "instanced_stream_llm_refusing") == 0
        assert _metric(web, 'instanced_stream_llm_refused_total{status="400"}') == 1
    finally:
        sim.config = sim.config.model_copy(update={"provider": "openai", "model": MODEL_NAME})
        proc.stop()
        print(proc.tail(30))


def test_azure_openai_deployment_api_version_and_key_header() -> None:
    """Azure's layout (deployment in the path, api-version in the query, the key in an
    api-key header) through the AzureOpenAI client, against the simulator's azure
    profile: a gpt-5 deployment gets the same probed shape as at OpenAI."""
    config = SimConfig(provider="azure", api_key="az-secret")
    with running_simulator(config) as (sim, url):
        endpoint = url.removesuffix("/v1")
        env = {
            "STREAM_LLM_BASE_URL": endpoint,
            "STREAM_LLM_API_VERSION": "2024-10-21",
            "STREAM_LLM_MODEL": MODEL,
            "STREAM_LLM_API_KEY": "az-secret",
        }
        done = _stream("check", "--endpoint", **env)
        assert done.returncode == 0, done.stderr
        assert "request shape (probed): max_completion_tokens, no temperature" in done.stdout
        assert sim.stats["probes"] == 1
        wrong = _stream("check", "--endpoint", **{**env, "STREAM_LLM_API_KEY": "az-wrong"})
        assert wrong.returncode == 2 and "401" in wrong.stderr, wrong.stderr
        no_version = _stream("check", "--endpoint", **{**env, "STREAM_LLM_API_VERSION": ""})
        assert no_version.returncode == 2, no_version.stdout  # plain client: wrong layout
