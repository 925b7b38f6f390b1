"""The worker distribution's `stream` (instanced_stream.cli.activities, shipped renamed as
instanced_stream_worker): `activities` runs, the processor's commands say in one line that
they are not installed there."""

from __future__ import annotations

import pytest
from instanced_stream.cli.activities import PRODUCT, WORKER_COMMANDS, main


def test_processor_commands_say_they_are_not_installed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert PRODUCT == "instanced_stream" and {"activities"} == WORKER_COMMANDS
    for command in ("process", "check", "demo", "eval"):
        assert main([command] if command != "eval" else [command, "x.jsonl"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1, err
        assert err[0].startswith(f"stream: error: `stream {command}` is not installed in the")


def test_activities_reaches_the_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["activities", "--help"])
    assert exited.value.code == 0
    assert "usage: stream activities" in capsys.readouterr().out
