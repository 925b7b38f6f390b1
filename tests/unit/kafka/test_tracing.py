"""traceparent header parsing and the bounded per-input memory."""

from __future__ import annotations

from instanced_stream.kafka.tracing import TraceContext, traceparent_of

GOOD = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_only_a_valid_traceparent_is_copied() -> None:
    assert traceparent_of([("TraceParent", GOOD)]) == (("traceparent", GOOD),)
    assert traceparent_of({"traceparent": GOOD.decode()}) == (("traceparent", GOOD),)
    zero = b"00-" + b"0" * 32 + b"-00f067aa0ba902b7-01"
    for bad in (b"garbage", zero, GOOD.upper()):
        assert traceparent_of([("traceparent", bad)]) == ()
    assert traceparent_of(None) == ()


def test_memory_is_bounded_and_own_headers_win() -> None:
    traces = TraceContext(keep=2)
    for offset in range(3):
        traces.remember(("items", 0, offset), [("traceparent", GOOD)])
    assert traces.headers(("items", 0, 0)) == ()  # forgotten first
    assert traces.headers(("items", 0, 2)) == (("traceparent", GOOD),)
    own = (("traceparent", b"00-" + b"1" * 32 + b"-" + b"2" * 16 + b"-00"),)
    assert traces.headers(("items", 0, 2), own) == own
    assert traces.headers(None) == ()
