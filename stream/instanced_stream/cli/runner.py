"""What every `stream` command shares, the product's and the activity worker's alike: the
one Settings object of a run, logging, and the mapping of user mistakes to one clear line
and an exit code instead of a traceback."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from aiokafka.errors import KafkaConnectionError
from pydantic import ValidationError

from instanced_stream.cli.parser import SETTING_FLAGS
from instanced_stream.errors import KafkaUnreachable, StreamError
from instanced_stream.termination import (
    TERMINATED_EXIT,
    Terminated,
    defer_sigterm,
    stop_if_asked,
    stopped_before_start,
    unwind_on_sigterm,
)

if TYPE_CHECKING:
    from instanced_stream.core.spec import AgentSpec
    from instanced_stream.settings import Settings

__all__ = ["Command", "configured", "run", "secure"]

Command = Callable[[argparse.Namespace, "Settings"], int]

# They print their own summaries; library start-up chatter (a new topic's leader
# election, group coordinator discovery) is retried noise there.
_QUIET = (
    "demo",
    "produce",
    "tail",
    "topics",
    "audit",
    "process-idea",
    "bench",
    "eval",
    "check",
    "redrive",
)
# Their start stays in the deferred mode of SIGTERM (`termination`) until their own loop
# handlers take over, which act on a SIGTERM recorded before: no exception is ever raised
# from the handler into the imports and validation of a deployment's start.
_STOP_THEMSELVES = ("process", "activities")


def configured(settings: Settings) -> tuple[AgentSpec, str]:
    """The validated spec and the broker address, or a clear error."""
    from instanced_stream.core.spec import load_spec

    spec = load_spec(settings.spec)
    if not settings.bootstrap_servers:
        raise StreamError("no broker: set STREAM_BOOTSTRAP_SERVERS (or run `stream broker`)")
    secure(settings)
    return spec, settings.bootstrap_servers


def secure(settings: Settings) -> None:
    """Files the Kafka security settings under the configured broker address."""
    from instanced_stream.kafka.clients import register_producer
    from instanced_stream.kafka.security import client_options, ignored_settings, register

    for warning in ignored_settings(settings):
        logging.getLogger("stream.settings").warning("%s", warning)
    if settings.bootstrap_servers:
        register(settings.bootstrap_servers, client_options(settings))
        register_producer(settings.bootstrap_servers, settings.kafka_compression)


def _settings(args: argparse.Namespace) -> Settings:
    """The one Settings object of this run: flags win over STREAM_* variables, which win
    over a .env file. Every command gets it explicitly; nothing writes os.environ."""
    from instanced_stream.settings import Settings

    flags = {name: getattr(args, name) for name in SETTING_FLAGS}
    if args.log_level:
        flags["log_level"] = args.log_level
    return Settings(**{k: v for k, v in flags.items() if v is not None})


def _logging(args: argparse.Namespace, settings: Settings) -> None:
    quiet = args.command in _QUIET and not args.verbose
    level = args.log_level or ("WARNING" if quiet else settings.log_level)
    if settings.log_format == "json":
        from instanced_stream.observe.logs import json_handler

        logging.basicConfig(level=level, handlers=[json_handler()])
    else:
        logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    if quiet and not args.log_level:
        logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    from instanced_stream.observe.logs import quiet_library_chatter

    quiet_library_chatter()


def run(args: argparse.Namespace, commands: Mapping[str, Command]) -> int:
    """Runs the parsed command; a user's mistake ends in one line and its exit code."""
    settings = None
    defer_sigterm()  # kept if the entry point set it; the worker distribution's starts here
    try:
        settings = _settings(args)
        _logging(args, settings)
        from instanced_stream.settings import warn_unknown_variables

        warn_unknown_variables(os.environ)
        if args.command in _STOP_THEMSELVES:
            stop_if_asked()
        else:
            unwind_on_sigterm()  # raises now if a SIGTERM came while the settings were read
        return int(commands[args.command](args, settings))
    except KafkaUnreachable as exc:
        print(f"stream: error: {exc.message}", file=sys.stderr)
        return 3
    except StreamError as exc:
        print(f"stream: error: {exc.message}", file=sys.stderr)
        return 2
    except KafkaConnectionError:
        where = settings.bootstrap_servers if settings else None
        print(f"stream: error: cannot reach Kafka at {where or 'the address'}", file=sys.stderr)
        return 3
    except ValidationError as exc:
        from instanced_stream.settings import setting_problem

        print(f"stream: error: {setting_problem(exc)}", file=sys.stderr)
        return 2
    except Terminated as stop:
        # Raised at a safe point of a start: nothing of it to undo. Raised while a command
        # ran: its children are stopped by now, and the exit is the shell's for SIGTERM.
        return stopped_before_start() if stop.before_start else TERMINATED_EXIT
    except KeyboardInterrupt:
        return 130
