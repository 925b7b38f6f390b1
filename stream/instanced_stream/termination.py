"""SIGTERM: a clean stop at a safe point while a command starts, an unwinding like Ctrl-C's
once a command that starts children runs.

Two modes, because an exception raised from a signal handler lands at whatever bytecode
the main thread runs, and some of those places cannot take one: raised inside a native
extension's initialisation (orjson's, during `import orjson`) it crashed the interpreter
(SIGSEGV, exit -11), and raised inside Python code called from C that does not pass
errors on (pydantic's `isinstance` through `abc.__instancecheck__`) it was printed as
"Exception ignored" and lost, with SIGTERM already ignored, so the process never stopped.

- **Deferred** (from the first line of the entry point, and for the whole start of
  `stream process` and `stream activities`): the handler only records the request.
  `stop_if_asked()` raises `Terminated` at the points the start passes (the commands
  loaded, the settings read), and the service's and the worker's own loop handlers, once
  installed, act on a request already recorded (`asked()`). A start has no long blocking
  call before those loop handlers, so the stop comes within the current step.
- **Unwinding** (`unwind_on_sigterm`, for the other commands once they run): SIGTERM
  raises `Terminated`, a KeyboardInterrupt, so the context managers and `finally` blocks
  that stop their children (the demo's broker, simulator and processors, the llama.cpp
  server of `--llm local`) run as for Ctrl-C; with Python's default action the children,
  in sessions of their own, were left running under init. Commands with a graceful stop
  of their own (`stream broker`, `stream llm-local`, `stream registry`) install their
  handlers while they run and take precedence.
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
    "asked",
    "defer_sigterm",
    "stop_if_asked",
    "stopped_before_start",
    "unwind_on_sigterm",
]

# What a shell reports for a process ended by SIGTERM (128 + 15).
TERMINATED_EXIT = 128 + signal.SIGTERM


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived: unwinding, children first. `before_start`: raised at a safe point
    of a start, before the command consumed or committed anything."""

    def __init__(self, *, before_start: bool) -> None:
        super().__init__()
        self.before_start = before_start


class _Request:
    """What the handler recorded: whether SIGTERM came, and whether it raises at once."""

    asked = False
    unwinding = False


def _handle(signum: int, frame: FrameType | None) -> None:
    _Request.asked = True
    if _Request.unwinding:
        # Once: a second SIGTERM during the clean-up must not cut it short (the children's
        # own stops are bounded; SIGKILL still ends everything).
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise Terminated(before_start=False)


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


def defer_sigterm() -> None:
    """From now on SIGTERM is recorded, not raised: `stop_if_asked()` and `asked()` read it.
    A request recorded before is kept."""
    _Request.unwinding = False
    signal.signal(signal.SIGTERM, _handle)


def asked() -> bool:
    """Whether SIGTERM came while this process ran its handler."""
    return _Request.asked


def stop_if_asked() -> None:
    """Raises `Terminated` (before the start) if SIGTERM came: a safe point of a start."""
    if _Request.asked:
        raise Terminated(before_start=True)


def unwind_on_sigterm() -> None:
    """From now on SIGTERM raises `Terminated` in the main thread; one recorded before
    raises now."""
    stop_if_asked()
    _Request.unwinding = True
    signal.signal(signal.SIGTERM, _handle)
