"""W3C Trace Context across the product: the `traceparent` header of an input record (and
its `tracestate`) is copied onto every record published because of it (calls, no-action,
advice, dead letters, proposals, done records), and activity workers copy it from a call
onto its result, so one trace follows an item through every topic.

The processor remembers the header per input position (topic, partition, offset) when it
takes the record; every OutRecord names that position as its `origin`. Bounded: the
oldest positions are forgotten first, long after their records were published.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["TRACES", "Headers", "TraceContext", "traceparent_of"]

Headers = tuple[tuple[str, bytes], ...]
Position = tuple[str, int, int]

# version-traceid-parentid-flags; all-zero ids are invalid by the specification.
_VALID = re.compile(rb"^[0-9a-f]{2}-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}$")
_KEEP = 200_000


def traceparent_of(headers: Iterable[tuple[str, Any]] | Mapping[str, Any] | None) -> Headers:
    """The record's traceparent, and its tracestate with it, as headers to copy (none
    when the traceparent is absent or malformed: a tracestate alone means nothing)."""
    pairs = headers.items() if isinstance(headers, Mapping) else (headers or ())
    found: dict[str, bytes] = {}
    for name, value in pairs:
        key = name.lower()
        if key in ("traceparent", "tracestate") and value is not None and key not in found:
            raw = value if isinstance(value, bytes) else str(value).encode()
            found[key] = raw.strip()
    parent = found.get("traceparent")
    if parent is None or not _VALID.match(parent):
        return ()
    state = found.get("tracestate")
    # W3C: at most 512 characters are worth propagating; a longer one may be dropped.
    if state and len(state) <= 512:
        return (("traceparent", parent), ("tracestate", state))
    return (("traceparent", parent),)


class TraceContext:
    def __init__(self, keep: int = _KEEP) -> None:
        self._keep = keep
        self._by_origin: OrderedDict[Position, Headers] = OrderedDict()

    def remember(self, origin: Position, headers: Any) -> None:
        found = traceparent_of(headers)
        if not found:
            return
        self._by_origin[origin] = found
        if len(self._by_origin) > self._keep:
            self._by_origin.popitem(last=False)

    def headers(self, origin: Position | None, own: Headers = ()) -> Headers:
        """A record's own headers, else those of the input it answers."""
        if own:
            return own
        return self._by_origin.get(origin, ()) if origin is not None else ()


# One per process: the intake and the publishers of one processor share it.
TRACES = TraceContext()
