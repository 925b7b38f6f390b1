"""A processor forked from the warm server behaves as a spawned one towards the harness:
its own process group, only the environment it was given, its exit status (a signal's
as negative), its output in its log. No broker: the product's own refusals end it."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from instanced_stream_bench.harness.demo import ProcessorProcess
from instanced_stream_bench.harness.warm_start import ENV, Forked, enabled, fork_processor


def test_the_tests_switch_it_on_and_users_do_not_get_it_by_default() -> None:
    assert enabled({ENV: "1"})
    assert not enabled({}) and not enabled({ENV: "0"})


def test_a_refused_setting_ends_the_forked_processor_with_its_status_and_line(
    tmp_path: Path,
) -> None:
    log = tmp_path / "processor.log"
    # Nothing of the test's own environment reaches the child: only what it is given.
    env = {"PATH": os.environ.get("PATH", ""), "STREAM_DELIVERY": "sometimes"}
    proc = fork_processor(env, log)
    assert proc.wait(60) == 2
    assert proc.poll() == proc.returncode == 2
    text = log.read_text()
    assert "STREAM_DELIVERY" in text, text
    assert "Traceback" not in text, text


def test_signals_reach_its_own_group_and_the_harness_sees_them(tmp_path: Path) -> None:
    log = tmp_path / "processor.log"
    proc = ProcessorProcess(
        {
            ENV: "1",
            "STREAM_BOOTSTRAP_SERVERS": "127.0.0.1:1",
            "STREAM_LLM_BASE_URL": "http://127.0.0.1:1/v1",
        },
        log,
    )
    proc.start()
    assert isinstance(proc.proc, Forked)
    pid = proc.proc.pid
    deadline = time.monotonic() + 30
    while os.getpgid(pid) != pid:  # its own session and group, made first thing
        assert time.monotonic() < deadline, "never made its own process group"
        time.sleep(0.01)
    with pytest.raises(subprocess.TimeoutExpired):
        proc.proc.wait(0.2)  # still trying to reach the model or the broker
    proc.kill()
    assert proc.proc.returncode == -signal.SIGKILL
