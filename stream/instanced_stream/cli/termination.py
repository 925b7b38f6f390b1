"""SIGTERM unwinds a command the way Ctrl-C does, so the children it started stop too.

Every command that starts children (the demo's broker, simulator and processors, the
llama.cpp server of `--llm local`, the bench's and the soak's processors) starts them in
context managers and `finally` blocks that stop them. Ctrl-C (SIGINT) runs those, as a
KeyboardInterrupt; SIGTERM (`timeout`, `kill`, a container runtime, a CI job's end)
ended the interpreter at once by default, and the children, in sessions of their own,
were left running under init. Here SIGTERM raises `Terminated`, a KeyboardInterrupt, so
the same unwinding runs. Commands with a graceful stop of their own (`stream process`,
`stream activities`, `stream broker`, `stream llm-local`) install their handlers while
they run and take precedence.
"""

from __future__ import annotations

import logging
import signal
import sys
from types import FrameType

__all__ = [
    "BEFORE_START",
    "TERMINATED_EXIT",
    "Terminated",
    "stopped_before_start",
    "unwind_on_sigterm",
]

# What a shell reports for a process ended by SIGTERM (128 + 15).
TERMINATED_EXIT = 128 + signal.SIGTERM


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived: unwinding, children first."""


def _raise(signum: int, frame: FrameType | None) -> None:
    # Once: a second SIGTERM during the clean-up must not cut it short (the children's
    # own stops are bounded; SIGKILL still ends everything).
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise Terminated()


# What a command stopped before it started says (a pod deleted while it starts): nothing
# to undo, so it is a clean stop, exit 0, not the silent 143 of Python's default action.
BEFORE_START = "stopped by a signal before it started: nothing consumed, nothing committed"


def stopped_before_start() -> int:
    """Says that the command stopped before it started; its exit code (0)."""
    log = logging.getLogger("instanced_stream.processor")
    if logging.getLogger().handlers and log.isEnabledFor(logging.INFO):
        log.info("%s", BEFORE_START)  # the command's logging is set up: in its format
    else:
        print(f"stream: {BEFORE_START}", file=sys.stderr)
    return 0


def unwind_on_sigterm() -> None:
    """From now on SIGTERM raises `Terminated` in the main thread."""
    signal.signal(signal.SIGTERM, _raise)
