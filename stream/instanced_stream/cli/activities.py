"""`stream activities`: an activity worker for a handler module. It is also the whole
`stream` of the activity workers' distribution (packages/activities), which ships the
worker and what it imports, not the processor nor the product's other commands: there
`stream activities` runs and every other command says in one line where it lives instead
of failing on an import. Where the product is installed too, the product's `stream`
answers."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
from typing import TYPE_CHECKING

from instanced_stream.cli.parser import build_parser
from instanced_stream.cli.runner import configured, run, secure
from instanced_stream.errors import StreamError

if TYPE_CHECKING:
    from instanced_stream.settings import Settings

__all__ = ["PRODUCT", "WORKER_COMMANDS", "activities", "main"]

# The product's import package: under the worker distribution this module is renamed with
# the rest, so this name is the product's, never the worker's own copy.
PRODUCT = "instanced_" + "stream"
WORKER_COMMANDS = frozenset({"activities"})


def activities(args: argparse.Namespace, settings: Settings) -> int:
    """Serves the handlers of `args.module` until stopped."""
    from instanced_stream.activities.worker import load_activities, serve_forever, spec_of_handlers

    overrides = {"worker_concurrency": args.concurrency, "worker_web_port": args.port}
    chosen = {k: v for k, v in overrides.items() if v is not None}
    if chosen:
        settings = settings.model_copy(update=chosen)
    registry = load_activities(args.module)
    if not args.no_spec:
        spec, bootstrap = configured(settings)
        return serve_forever(registry, settings, spec, bootstrap, args.group)
    if not args.group:
        raise StreamError("--no-spec needs --group: name your team's consumer group")
    if not settings.bootstrap_servers:
        raise StreamError("no broker: set STREAM_BOOTSTRAP_SERVERS")
    secure(settings)
    spec = spec_of_handlers(registry)
    return serve_forever(registry, settings, spec, settings.bootstrap_servers, args.group)


def main(argv: list[str] | None = None) -> int:
    """The worker distribution's `stream`."""
    own = __name__.split(".", 1)[0]
    if own != PRODUCT and importlib.util.find_spec(PRODUCT) is not None:
        # both distributions installed: whichever wrote bin/stream last, the product answers
        product_cli = importlib.import_module(f"{PRODUCT}.cli.main")
        return int(product_cli.main(argv))
    args = build_parser().parse_args(argv)
    if args.command not in WORKER_COMMANDS:
        print(
            f"stream: error: `stream {args.command}` is not installed in the worker package "
            "(instanced-stream-activities runs `stream activities` only); install "
            "instanced-stream for it",
            file=sys.stderr,
        )
        return 2
    return run(args, {"activities": activities})
