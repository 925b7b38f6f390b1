"""What a fenced transactional producer leaves behind: its transaction's outcome, which
no call can collect.

aiokafka gives each transaction a future of its outcome (made by `begin_transaction`,
awaited by `commit_transaction` and `abort_transaction`). When the producer is fenced
(another member took its partition with the same transactional id: a processor frozen
past its session timeout, then thawed), the sender sets that future to `ProducerFenced`
and the producer enters its fatal state, in which commit and abort both refuse to run
(an invalid state transition) before they await it; aiokafka's own `transaction()`
context returns without it. So the unit that sees the fence (its sends fail with
`ProducerFenced`; it is dropped and its partition redone by the new owner, one line)
cannot collect it, and once the producer is gone asyncio reported each one as `Future
exception was never retrieved` with a traceback: a dozen at a fenced member's stop.
The loop's exception handler (asyncio's public hook for exactly these reports) takes
those to DEBUG and leaves every other report to the default handler.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from aiokafka.errors import ProducerFenced

__all__ = ["quiet_fenced_transactions"]

log = logging.getLogger("stream.unit")

_UNRETRIEVED = "Future exception was never retrieved"


def quiet_fenced_transactions(loop: asyncio.AbstractEventLoop) -> None:
    """From now on `loop` reports a fenced transaction's uncollected outcome at DEBUG;
    whatever else it reports goes where it went before."""
    before = loop.get_exception_handler()

    def handle(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if context.get("message") == _UNRETRIEVED and isinstance(
            context.get("exception"), ProducerFenced
        ):
            log.debug("a fenced producer's transaction ended: %r", context["exception"])
            return
        if before is not None:
            before(loop, context)
        else:
            loop.default_exception_handler(context)

    loop.set_exception_handler(handle)
