"""`stream` as the activity workers' distribution installs it (packages/activities): that
distribution ships the worker and what it imports, not the processor, so `stream
activities` runs and every other command says in one line where it lives instead of
failing on an import. Where the product is installed too, it is the product's `stream`."""

from __future__ import annotations

import importlib.util
import sys

from instanced_stream.ops.parser import build_parser

__all__ = ["PRODUCT", "WORKER_COMMANDS", "main"]

# The product's import package: under the worker distribution this module is renamed with
# the rest, so this name is the product's, never the worker's own copy.
PRODUCT = "instanced_" + "stream"
WORKER_COMMANDS = frozenset({"activities"})


def main(argv: list[str] | None = None) -> int:
    own = __name__.split(".", 1)[0]
    if own != PRODUCT and importlib.util.find_spec(PRODUCT) is not None:
        # both distributions installed: whichever wrote bin/stream last, the product answers
        product_cli = importlib.import_module(f"{PRODUCT}.ops.cli")
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
    cli = importlib.import_module(f"{own}.ops.cli")
    return int(cli.main(argv))
