"""User mistakes end in one clear line and an exit code, never a traceback."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def _stream(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("STREAM_", "OPENAI_"))}
    return subprocess.run(
        [sys.executable, "-m", "instanced_stream", *args],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=50,
        check=False,
    )


def test_unreachable_broker(tmp_path: Path) -> None:
    done = _stream("--bootstrap-servers", "127.0.0.1:1", "audit")
    assert done.returncode == 3
    assert "stream: error: cannot reach Kafka at 127.0.0.1:1" in done.stderr
    assert "Traceback" not in done.stderr


def test_bad_spec_and_bad_setting(tmp_path: Path) -> None:
    bad = tmp_path / "agent.yaml"
    bad.write_text("name: x\ninstructions: y\ntools: []\n")
    done = _stream("--spec", str(bad), "--bootstrap-servers", "127.0.0.1:1", "process")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "agent spec" in done.stderr and "tools" in done.stderr
    done = _stream("audit", STREAM_PARTITIONS="many")
    assert done.returncode == 2 and "bad setting STREAM_PARTITIONS='many'" in done.stderr


def test_missing_api_key_is_named(tmp_path: Path) -> None:
    spec = tmp_path / "agent.yaml"
    spec.write_text(
        "name: x\ninstructions: y\nmodel: {base_url: 'http://127.0.0.1:9/v1'}\n"
        "tools: [{name: t, description: d}]\n"
    )
    done = _stream("--spec", str(spec), "--bootstrap-servers", "127.0.0.1:1", "process")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "no API key: set OPENAI_API_KEY" in done.stderr


def test_an_endpoint_that_refuses_the_key_or_the_model_stops_the_processor_at_start() -> None:
    from instanced_stream_bench.testing.sim.server import SimConfig, running_simulator

    with running_simulator(SimConfig(api_key="sk-right")) as (_, url):
        common = {"STREAM_BOOTSTRAP_SERVERS": "127.0.0.1:1", "STREAM_LLM_BASE_URL": url}
        wrong = _stream("process", STREAM_LLM_API_KEY="sk-wrong", **common)
        assert wrong.returncode == 2 and "Traceback" not in wrong.stderr, wrong.stderr[-800:]
        assert "refuses us" in wrong.stderr and "401" in wrong.stderr
        assert "sk-wrong" not in wrong.stderr + wrong.stdout  # the key is never printed
        unknown = _stream(
            "process", STREAM_LLM_API_KEY="sk-right", STREAM_LLM_MODEL="no-such-model", **common
        )
        assert unknown.returncode == 2 and "404" in unknown.stderr, unknown.stderr[-800:]
        assert "'no-such-model'" in unknown.stderr


def test_a_hosted_endpoint_from_the_environment_needs_a_key() -> None:
    done = _stream(
        "process",
        STREAM_BOOTSTRAP_SERVERS="127.0.0.1:1",
        STREAM_LLM_BASE_URL="https://llm.example.invalid/v1",
    )
    assert done.returncode == 2 and "no API key: set OPENAI_API_KEY" in done.stderr


def test_commands_that_read_the_topics_refuse_a_prefix_that_matches_nothing(
    bootstrap: str,
) -> None:
    """`--topic-prefix typo-` once audited nothing and said missing=0, exit 0."""
    import secrets

    prefix = f"typo-{secrets.token_hex(3)}-"
    env = {"STREAM_BOOTSTRAP_SERVERS": bootstrap, "STREAM_TOPIC_PREFIX": prefix}
    for command in (["audit"], ["tail", "deadletter"], ["redrive", "--dry-run"], ["topics"]):
        done = _stream(*command, **env)
        assert done.returncode == 2, (command, done.stdout, done.stderr)
        said = done.stderr.strip().splitlines()[-1]
        assert said.startswith("stream: error: no such topic"), (command, said)
        assert f"topic prefix '{prefix}'" in said and f"{prefix}" in said.split(": ", 2)[2]
        assert "Traceback" not in done.stderr
        assert "missing=0" not in done.stdout
    audit = _stream("audit", **env).stderr
    assert f"{prefix}items" in audit and f"{prefix}stream.deadletter" in audit


def _starting_against(endpoint: socket.socket) -> subprocess.Popen[str]:
    """`stream process` spawned as a user starts it, its model `endpoint` (a socket that
    accepts and never answers, so the start-up waits at its probe) and no broker."""
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("STREAM_", "OPENAI_"))},
        "STREAM_BOOTSTRAP_SERVERS": "127.0.0.1:1",
        "STREAM_LLM_BASE_URL": f"http://127.0.0.1:{endpoint.getsockname()[1]}/v1",
        "STREAM_WEB_PORT": "0",
        # A crash in the start (a SIGSEGV seen once, with no output at all) shows its stack.
        "PYTHONFAULTHANDLER": "1",
    }
    return subprocess.Popen(
        [sys.executable, "-m", "instanced_stream", "process"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_a_processor_stopped_while_it_starts_exits_0_and_says_so() -> None:
    """SIGTERM while the processor probes its endpoint (a pod deleted as it starts) ended
    it with 143 and not a line in its log."""
    import signal

    with socket.socket() as endpoint:  # accepts connections, never answers
        endpoint.bind(("127.0.0.1", 0))
        endpoint.listen(8)
        endpoint.settimeout(40)
        proc = _starting_against(endpoint)
        try:
            probe, _ = endpoint.accept()  # waited for: the start-up's probe request
            probe.close()
            proc.send_signal(signal.SIGTERM)
            out, _ = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == 0, out
    assert "stopped by a signal before it started" in out
    assert "Traceback" not in out and "Unclosed" not in out


def _catches_sigterm(pid: int) -> bool:
    """Whether the process has a handler of its own for SIGTERM (its SigCgt mask in
    /proc): before it does, SIGTERM is Python's default action, death with 143."""
    import signal

    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (signal.SIGTERM - 1) & 1)
    return False


@pytest.mark.parametrize("after_s", [0.0, 0.1, 0.3, 0.6, 1.0, 1.5, 2.5])
def test_sigterm_at_any_moment_of_the_start_exits_0_and_says_so(after_s: float) -> None:
    """SIGTERM `after_s` after the process can catch it at all (its own handler in
    /proc/<pid>/status, the earliest moment a signal can be anything but death): while
    it imports the commands, parses, reads its settings, loads the runtime, probes the
    endpoint. Each ends with exit 0 and the line; the handler was installed only after
    the imports before, and a SIGTERM while the runtime loaded ended it with 143."""
    import signal
    import time

    with socket.socket() as endpoint:  # accepts connections, never answers
        endpoint.bind(("127.0.0.1", 0))
        endpoint.listen(8)
        proc = _starting_against(endpoint)
        try:
            began = time.monotonic()
            while not _catches_sigterm(proc.pid):
                assert proc.poll() is None and time.monotonic() < began + 20
                time.sleep(0.002)
            caught_in = time.monotonic() - began
            time.sleep(after_s)
            assert proc.poll() is None, "it ended before the signal"
            proc.send_signal(signal.SIGTERM)
            out, _ = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
    print(f"SIGTERM caught {caught_in:.3f} s after the spawn; sent {after_s} s later")
    assert proc.returncode == 0, out
    assert "stopped by a signal before it started" in out, out
    assert "Traceback" not in out and "Unclosed" not in out, out
