"""The `stream` command's entry point: SIGTERM is caught before anything else is imported.

Importing the commands (the Kafka client, pydantic, the runtime) takes the first half
second or more of a start; with Python's default action a SIGTERM in that time (a pod
deleted as it starts, a chaos run) ended the process with 143 and not a line. Here the
handler is installed first, deferred (`termination`): a SIGTERM at any moment of the start
is recorded and acted on at the next safe point, one line and exit 0, since nothing was
consumed or committed yet. Only the interpreter's own start, before this module runs, is
out of reach.
"""

from __future__ import annotations

from instanced_stream.termination import (
    Terminated,
    defer_sigterm,
    stop_if_asked,
    stopped_before_start,
)

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """`stream`: the product's commands (`cli.main`), loaded once SIGTERM is caught."""
    defer_sigterm()
    try:
        from instanced_stream.cli.main import main as commands

        stop_if_asked()  # the commands are loaded: a SIGTERM while they loaded stops here
        # A SIGTERM once a command runs is that command's (`runner.run`): one that comes
        # out here came while the arguments were parsed.
        return commands(argv)
    except Terminated:
        return stopped_before_start()
