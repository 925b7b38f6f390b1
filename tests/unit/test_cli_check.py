"""The CLI's one Settings object, `stream --version`, `stream check` and the small
ops helpers it relies on (ports, --since, lag series, process metrics). No network."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest
import yaml

from instanced_stream import __version__
from instanced_stream.errors import StreamError
from instanced_stream.ops import cli
from instanced_stream.ops.audit import parse_since
from instanced_stream.ops.metrics import Metrics
from instanced_stream.ops.parser import build_parser
from instanced_stream.ops.web import claim_port
from instanced_stream.settings import DEFAULT_SPEC

SPEC = Path(__file__).resolve().parents[2] / "examples" / "moderation" / "agent.yaml"


@pytest.fixture(autouse=True)
def _no_endpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("STREAM_"):
            monkeypatch.delenv(name)


def test_version_prints_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as ended:
        cli.main(["--version"])
    assert ended.value.code == 0
    assert capsys.readouterr().out.strip() == f"stream {__version__}"


def test_check_passes_on_the_example(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["check", "--spec", str(SPEC)]) == 0
    assert cli.main(["--spec", str(SPEC), "check"]) == 0
    out = capsys.readouterr().out
    assert "valid (moderation" in out
    assert "bundled LLM simulator" in out


def test_check_refuses_a_model_the_simulator_does_not_serve(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = yaml.safe_load(SPEC.read_text())
    data["model"]["name"] = "gpt-nonexistent"
    spec = tmp_path / "agent.yaml"
    spec.write_text(yaml.safe_dump(data))
    assert cli.main(["--spec", str(spec), "check"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "'gpt-nonexistent' is unknown to the bundled LLM simulator" in err[0]


def test_check_refuses_colliding_ports_and_an_impossible_isr(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("STREAM_WORKER_WEB_PORT", "6066")
    assert cli.main(["check"]) == 2
    assert "both 6066" in capsys.readouterr().err
    monkeypatch.delenv("STREAM_WORKER_WEB_PORT")
    monkeypatch.setenv("STREAM_REPLICATION_FACTOR", "2")
    monkeypatch.setenv("STREAM_MIN_INSYNC_REPLICAS", "3")
    assert cli.main(["check"]) == 2
    assert "exceeds STREAM_REPLICATION_FACTOR=2" in capsys.readouterr().err


def test_check_wants_a_key_for_a_hosted_endpoint(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("STREAM_LLM_BASE_URL", "https://models.invalid/v1")
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    assert cli.main(["check"]) == 2
    assert "no API key" in capsys.readouterr().err


def test_flags_build_one_settings_object_and_leave_the_environment_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("STREAM_TOPIC_PREFIX", "from-env.")
    args = build_parser().parse_args(
        ["--topic-prefix", "from-flag.", "--bootstrap-servers", "k:9092", "check"]
    )
    settings = cli._settings(args)
    assert settings.topic_prefix == "from-flag."
    assert settings.bootstrap_servers == "k:9092"
    assert settings.spec == DEFAULT_SPEC
    assert os.environ["STREAM_TOPIC_PREFIX"] == "from-env."
    assert "STREAM_BOOTSTRAP_SERVERS" not in os.environ


def test_setting_flags_work_before_and_after_the_command() -> None:
    parse = build_parser().parse_args
    assert parse(["--topic-prefix", "a.", "check"]).topic_prefix == "a."
    assert parse(["check", "--topic-prefix", "b."]).topic_prefix == "b."
    assert parse(["--topic-prefix", "a.", "audit", "--topic-prefix", "b."]).topic_prefix == "b."
    assert parse(["audit"]).topic_prefix is None


def test_log_level_is_per_command() -> None:
    args = build_parser().parse_args(["audit", "--log-level", "debug"])
    assert args.log_level == "DEBUG"
    assert cli._settings(args).log_level == "DEBUG"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["audit", "--log-level", "chatty"])


def test_activities_flags() -> None:
    args = build_parser().parse_args(
        ["activities", "m.py", "--group", "team-a", "--concurrency", "3", "--port", "7000"]
    )
    assert (args.group, args.concurrency, args.port) == ("team-a", 3, 7000)


def test_since_offsets_durations_and_times() -> None:
    assert parse_since("1200") == ("offset", 1200)
    kind, ms = parse_since("2h")
    assert kind == "time"
    assert abs(ms - (time.time() - 7200) * 1000) < 5000
    assert parse_since("2026-01-02T03:04:05Z") == ("time", 1767323045000)
    assert parse_since("2026-01-02T03:04:05") == ("time", 1767323045000)
    with pytest.raises(StreamError, match="--since 'yesterday'"):
        parse_since("yesterday")


def test_a_busy_port_is_an_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(StreamError, match=f"port {port} on 127.0.0.1 is busy"):
            claim_port("127.0.0.1", port, "STREAM_WEB_PORT")
    claim_port("127.0.0.1", port, "STREAM_WEB_PORT")  # free again: no error
    claim_port("127.0.0.1", 0, "STREAM_WEB_PORT")  # 0: any free port


def test_processor_and_worker_ports_differ_by_default() -> None:
    from instanced_stream.settings import Settings

    s = Settings()
    assert (s.web_port, s.worker_web_port) == (6066, 6067)


def test_lag_series_of_revoked_partitions_are_removed() -> None:
    m = Metrics()
    m.set_lag({0: 5, 1: 7})
    m.set_lag({1: 2})
    text = m.render().decode()
    assert 'instanced_stream_consumer_lag{partition="1"} 2.0' in text
    assert 'partition="0"' not in text


def test_process_metrics_and_endpoint_health() -> None:
    m = Metrics()
    assert "process_resident_memory_bytes" in m.render().decode()
    assert m.endpoint_ok
    m.on_refused(401)
    assert not m.endpoint_ok
    m.on_refused(None)
    m.on_circuit(True)
    assert not m.endpoint_ok
    m.on_circuit(False)
    assert m.endpoint_ok


def test_process_refuses_a_busy_port_before_touching_the_network(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        monkeypatch.setenv("STREAM_BOOTSTRAP_SERVERS", "127.0.0.1:1")  # never contacted
        monkeypatch.setenv("STREAM_LLM_BASE_URL", "http://127.0.0.1:1/v1")
        monkeypatch.setenv("STREAM_WEB_HOST", "127.0.0.1")
        monkeypatch.setenv("STREAM_WEB_PORT", str(port))
        assert cli.main(["process"]) == 2
    err = capsys.readouterr().err
    assert f"port {port} on 127.0.0.1 is busy" in err and "STREAM_WEB_PORT" in err


def test_a_worker_without_spec_needs_its_own_group(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    example = SPEC.parent / "activities.py"
    monkeypatch.setenv("STREAM_BOOTSTRAP_SERVERS", "127.0.0.1:1")  # never contacted
    assert cli.main(["activities", str(example), "--no-spec"]) == 2
    assert "--no-spec needs --group" in capsys.readouterr().err
