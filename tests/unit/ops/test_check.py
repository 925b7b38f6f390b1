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
from instanced_stream.cli import main as cli
from instanced_stream.cli import runner
from instanced_stream.cli.parser import build_parser
from instanced_stream.errors import StreamError
from instanced_stream.observe.metrics import Metrics
from instanced_stream.observe.web import claim_port
from instanced_stream.ops.audit import parse_since
from instanced_stream.settings import DEFAULT_SPEC

SPEC = Path(__file__).resolve().parents[3] / "examples" / "moderation" / "agent.yaml"


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


def test_check_passes_on_the_example(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("STREAM_LLM_BASE_URL", "http://127.0.0.1:8000/v1")
    assert cli.main(["check", "--spec", str(SPEC)]) == 0
    assert cli.main(["--spec", str(SPEC), "check"]) == 0
    out = capsys.readouterr().out
    assert "valid (moderation" in out
    assert "endpoint http://127.0.0.1:8000/v1: not contacted" in out


def _refusal(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert cli.main(list(argv)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_check_refuses_what_process_refuses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each mistake a processor refuses before touching the network, `stream check`
    refuses in the same words (no broker is needed for either to say so)."""
    monkeypatch.setenv("STREAM_BOOTSTRAP_SERVERS", "127.0.0.1:1")
    # no model endpoint at all
    said = _refusal(capsys, "check")
    assert said == _refusal(capsys, "process")
    assert "no model endpoint" in said
    # a window too small for the instructions alone
    data = yaml.safe_load(SPEC.read_text())
    data["window"]["max_input_tokens"] = 300
    small = tmp_path / "agent.yaml"
    small.write_text(yaml.safe_dump(data))
    monkeypatch.setenv("STREAM_LLM_BASE_URL", "http://127.0.0.1:8000/v1")
    said = _refusal(capsys, "--spec", str(small), "check")
    assert said == _refusal(capsys, "--spec", str(small), "process")
    assert "window.max_input_tokens is 300" in said
    # a Kafka CA file that is not there
    monkeypatch.setenv("STREAM_KAFKA_SECURITY_PROTOCOL", "SSL")
    monkeypatch.setenv("STREAM_KAFKA_SSL_CAFILE", str(tmp_path / "nope.pem"))
    said = _refusal(capsys, "check")
    assert said == _refusal(capsys, "process")
    assert "STREAM_KAFKA_SSL_CAFILE: no such file" in said


def test_check_and_process_refuse_auth_mistakes_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each used to pass `stream check` (or end it in a traceback) and then look like an
    unreachable broker."""
    import trustme

    monkeypatch.setenv("STREAM_BOOTSTRAP_SERVERS", "127.0.0.1:1")
    monkeypatch.setenv("STREAM_LLM_BASE_URL", "http://127.0.0.1:8000/v1")
    monkeypatch.setenv("STREAM_KAFKA_SECURITY_PROTOCOL", "SASL_SSL")
    monkeypatch.setenv("STREAM_KAFKA_SASL_MECHANISM", "OAUTHBEARER")
    monkeypatch.setenv("STREAM_KAFKA_SASL_OAUTH_TOKEN_FILE", str(tmp_path / "absent"))
    said = _refusal(capsys, "check")
    assert said == _refusal(capsys, "process")
    assert said.startswith("stream: error: STREAM_KAFKA_SASL_OAUTH_TOKEN_FILE: cannot read")
    for name in ("STREAM_KAFKA_SASL_MECHANISM", "STREAM_KAFKA_SASL_OAUTH_TOKEN_FILE"):
        monkeypatch.delenv(name)
    cert = tmp_path / "cert.pem"
    trustme.CA().issue_cert("client.example").cert_chain_pems[0].write_to_path(str(cert))
    monkeypatch.setenv("STREAM_KAFKA_SECURITY_PROTOCOL", "SSL")
    monkeypatch.setenv("STREAM_KAFKA_SSL_CERTFILE", str(cert))
    said = _refusal(capsys, "check")
    assert said == _refusal(capsys, "process")
    assert said.startswith(f"stream: error: STREAM_KAFKA_SSL_CERTFILE={cert}: no private key")


def test_bad_settings_name_their_variable_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("STREAM_LOG_LEVEL", "foo")
    said = _refusal(capsys, "check")
    assert said.startswith("stream: error: bad setting STREAM_LOG_LEVEL='foo': ")
    monkeypatch.delenv("STREAM_LOG_LEVEL")
    monkeypatch.setenv("STREAM_PARTITIONS", "many")
    assert _refusal(capsys, "check").startswith(
        "stream: error: bad setting STREAM_PARTITIONS='many': Input should be a valid integer"
    )
    monkeypatch.setenv("STREAM_PARTITIONS", "0")
    assert "STREAM_PARTITIONS='0': Input should be greater than or equal to 1" in _refusal(
        capsys, "check"
    )
    monkeypatch.delenv("STREAM_PARTITIONS")
    monkeypatch.setenv("OPENAI_BASE_URL", "")
    monkeypatch.setenv("STREAM_LLM_PACING", "sometimes")
    assert "bad setting STREAM_LLM_PACING='sometimes'" in _refusal(capsys, "check")


def test_the_log_level_is_read_in_any_case(monkeypatch: pytest.MonkeyPatch) -> None:
    from instanced_stream.settings import Settings

    monkeypatch.setenv("STREAM_LOG_LEVEL", "debug")
    assert Settings().log_level == "DEBUG"


def test_bad_flags_end_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    for argv, words in (
        (["eval", "x.jsonl", "--windows", "x"], "'x' is not a comma-separated list"),
        (["eval", "x.jsonl", "--windows", "10,0"], "window sizes are 1 or more"),
        (["bench", "--windows", "ten"], "'ten' is not a comma-separated list"),
        (["demo", "--items", "many"], "invalid int value: 'many'"),
        (["nonsense"], "invalid choice: 'nonsense'"),
    ):
        with pytest.raises(SystemExit) as exited:
            cli.main(argv)
        assert exited.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and words in err[0], (argv, err)
        assert err[0].startswith("stream")


def test_a_misspelt_variable_is_named_with_the_closest_setting(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    from instanced_stream.settings import unknown_variables

    assert unknown_variables(["STREAM_PARTITONS", "STREAM_LOG_LEVEL", "STREAM_KAFKA_CACHE"]) == [
        "STREAM_PARTITONS is not a setting and is ignored; did you mean STREAM_PARTITIONS?"
    ]
    assert unknown_variables(["STREAM_ZZZZZZZZZZZZZZZZZZZZZ", "HOME"]) == [
        "STREAM_ZZZZZZZZZZZZZZZZZZZZZ is not a setting and is ignored"
    ]
    # the CLI logs it as a warning and goes on
    monkeypatch.setenv("STREAM_LLM_BASE_URL", "http://127.0.0.1:8000/v1")
    monkeypatch.setenv("STREAM_BOOTSTRAP_SERVER", "127.0.0.1:9092")
    assert cli.main(["check"]) == 0
    assert "STREAM_BOOTSTRAP_SERVER is not a setting" in caplog.text
    assert "did you mean STREAM_BOOTSTRAP_SERVERS?" in caplog.text
    # and of the .env file pydantic reads
    monkeypatch.delenv("STREAM_BOOTSTRAP_SERVER")
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".env").write_text("STREAM_TOPIC_PREFX=x.\n")
    assert cli.main(["check"]) == 0
    assert "did you mean STREAM_TOPIC_PREFIX?" in caplog.text


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
    settings = runner._settings(args)
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
    assert runner._settings(args).log_level == "DEBUG"
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
    m.partitions.set_lag({0: 5, 1: 7})
    m.partitions.set_lag({1: 2})
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


def test_a_spec_that_does_not_parse_is_one_line_with_file_line_and_column(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "agent.yaml"
    bad.write_text("name: x\n  tools: [\n")
    assert _refusal(capsys, "--spec", str(bad), "check") == (
        f"stream: error: agent spec {bad}:2:8: not valid YAML: mapping values are not allowed here"
    )
    unclosed = tmp_path / "open.yaml"
    unclosed.write_text('name: x\ninstructions: "unclosed\n')
    said = _refusal(capsys, "--spec", str(unclosed), "check")
    assert said.startswith(f"stream: error: agent spec {unclosed}:3:1: not valid YAML: ")
    assert said.endswith("(while scanning a quoted scalar at line 2)")
    broken = tmp_path / "agent.json"
    broken.write_text('{"name": "x",\n "tools": }')
    assert _refusal(capsys, "--spec", str(broken), "check").startswith(
        f"stream: error: agent spec {broken}:2:11: not valid JSON: "
    )


def test_every_command_help_opens_with_what_it_does(capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert {"process", "check", "audit", "demo", "broker"} <= set(commands.choices)
    for name, sub in commands.choices.items():
        assert sub.description, f"`stream {name} --help` does not say what it does"
        with pytest.raises(SystemExit):
            parser.parse_args([name, "--help"])
        shown = capsys.readouterr().out
        after_usage = shown.split("\n\n", 1)[1]
        assert after_usage.startswith(sub.description[:40]), (name, after_usage[:80])


def test_verbose_and_log_level_work_after_the_command() -> None:
    parser = build_parser()
    after = parser.parse_args(["audit", "-v", "--log-level", "debug"])
    assert after.verbose is True and after.log_level == "DEBUG"
    assert parser.parse_args(["-v", "audit"]).verbose is True
    assert parser.parse_args(["audit"]).verbose is False


def test_check_reports_a_busy_web_port(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("STREAM_LLM_BASE_URL", "http://127.0.0.1:8000/v1")
    monkeypatch.setenv("STREAM_WEB_HOST", "127.0.0.1")
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        monkeypatch.setenv("STREAM_WEB_PORT", str(port))
        assert cli.main(["check", "--spec", str(SPEC)]) == 0
    out = capsys.readouterr().out
    assert f"warning: port {port} on 127.0.0.1 is busy" in out
    assert "set STREAM_WEB_PORT to a free port" in out
