"""Processors forked from a warm interpreter: the same `stream process`, without paying
Python's start-up each time.

A processor spends most of its start importing (openai's types alone are hundreds of
modules): 2-3 s of one core on this 2-core machine, and the suite starts hundreds of
them. With `INSTANCED_STREAM_BENCH_WARM_START=1` (the tests set it; not `STREAM_*`, which
the processor reads as its own settings) the bench starts one
multiprocessing forkserver that has imported the processor's modules once, and forks each
processor from it: its own OS process, its own session and process group (so a test can
SIGKILL or SIGSTOP it as ops would), its own environment, working directory and log,
running the product's own entry point (`cli/entry.py`) with `process`. Nothing of a
processor's state is shared: the server imports modules and never runs one. What a fork
cannot show, the start-up of a fresh interpreter itself (the command line, an import that
fails, a SIGTERM while it imports), the CLI tests run with `subprocess` as users do.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import subprocess
import sys
from multiprocessing.context import ForkServerContext
from pathlib import Path
from typing import Protocol

from instanced_stream_bench.testing.broker import die_with_parent

__all__ = ["ENV", "Forked", "Running", "enabled", "fork_processor"]

ENV = "INSTANCED_STREAM_BENCH_WARM_START"

# What `stream process` imports before it reads a record: imported once, in the server.
_PRELOAD = [
    "instanced_stream.cli.entry",
    "instanced_stream.cli.main",
    "instanced_stream.ops.check",
    "instanced_stream.runtime.service",
    "instanced_stream.runtime.assembly",
]


class Running(Protocol):
    """What the harness and the tests use of a running processor: `subprocess.Popen`'s."""

    @property
    def pid(self) -> int: ...

    @property
    def returncode(self) -> int | None: ...

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def send_signal(self, sig: int) -> None: ...


def enabled(env: dict[str, str]) -> bool:
    return env.get(ENV, "") not in ("", "0")


_context: ForkServerContext | None = None


def _server() -> ForkServerContext:
    global _context
    if _context is None:
        ctx = multiprocessing.get_context("forkserver")
        assert isinstance(ctx, ForkServerContext)
        ctx.set_forkserver_preload(_PRELOAD)
        _context = ctx
    return _context


class Forked:
    """A forked processor seen as `subprocess.Popen` sees a child: the forkserver reaps it
    and passes its exit status on (negative: the signal that ended it, as Popen says)."""

    def __init__(self, process: multiprocessing.process.BaseProcess) -> None:
        self._process = process
        assert process.pid is not None
        self._pid = process.pid

    @property
    def pid(self) -> int:
        return self._pid

    @property
    def returncode(self) -> int | None:
        return self._process.exitcode

    def poll(self) -> int | None:
        return self._process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        code = self._process.exitcode
        if code is None:
            raise subprocess.TimeoutExpired(["stream", "process"], timeout or 0)
        return code

    def send_signal(self, sig: int) -> None:
        if self._process.exitcode is None:
            os.kill(self._pid, sig)


def fork_processor(env: dict[str, str], log_path: Path) -> Forked:
    """`stream process` with this environment, its output appended to `log_path`."""
    process = _server().Process(
        target=_processor, args=(env, str(log_path), os.getcwd()), name="stream-process"
    )
    process.start()
    return Forked(process)


def _processor(env: dict[str, str], log_path: str, cwd: str) -> None:
    """The child: what `subprocess.Popen(["stream", "process"], start_new_session=True,
    env=env, stdout=log, stderr=STDOUT)` with the harness's pre-exec sets up, then the
    product's command, whose exit status becomes the child's."""
    os.setsid()
    die_with_parent()
    signal.signal(signal.SIGINT, signal.default_int_handler)
    log = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    sys.argv = ["stream", "process"]
    from instanced_stream.cli.entry import main

    code = main(["process"])
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
