"""`stream redrive`'s plan (ops/redrive.py) and the audit's view of re-driven inputs."""

from __future__ import annotations

import base64
from typing import Any

from instanced_stream.ops.audit import final_attempts
from instanced_stream.ops.redrive import (
    REDRIVE,
    REDRIVE_COUNT,
    REDRIVE_OF,
    WORTH,
    Attempt,
    Input,
    attempt_of,
    left_out,
    plan,
)

DL = "p.deadletter"
IN = "p.items"


def _letter(offset: int, code: str = "unanswered", **extra: Any) -> dict[str, Any]:
    source = {"topic": IN, "partition": 0, "offset": offset}
    return {"code": code, "scope": "item", "instance": f"i{offset}", "source": source, **extra}


def test_each_item_letter_of_a_worthy_code_is_redriven_with_headers_naming_it() -> None:
    inputs = {(IN, 0, 5): Input(b"i5", b'{"x":1}', Attempt())}
    letters = [((DL, 0, 0), _letter(5)), ((DL, 0, 1), _letter(6, "not_json"))]
    [one] = plan(letters, inputs, WORTH)
    assert one.skipped is None and (one.key, one.value) == (b"i5", b'{"x":1}')
    assert dict(one.headers or []) == {
        REDRIVE: f"{DL}/0/0".encode(),
        REDRIVE_OF: f"{IN}/0/5".encode(),
        REDRIVE_COUNT: b"1",
    }
    assert attempt_of(one.headers) == Attempt((IN, 0, 5), 1, (DL, 0, 0))
    assert plan(letters, inputs, ["not_json"])[0].skipped == (
        "its input is gone and the dead letter does not carry it"
    )


def test_a_letter_redriven_before_or_of_a_failed_redrive_is_not_sent_again() -> None:
    redriven = Attempt((IN, 0, 5), 1, (DL, 0, 0))
    inputs = {
        (IN, 0, 5): Input(b"i5", b"{}", Attempt()),
        (IN, 0, 9): Input(b"i5", b"{}", redriven),
    }
    letters = [((DL, 0, 0), _letter(5)), ((DL, 0, 3), _letter(9))]
    got = plan(letters, inputs, WORTH)
    assert [p.skipped for p in got] == ["re-driven before", "a re-drive that failed again (1 of 1)"]
    second = plan(letters, inputs, WORTH, max_redrives=2)[1]
    assert second.skipped is None
    assert dict(second.headers or [])[REDRIVE_OF] == f"{IN}/0/5".encode()  # the first attempt
    assert dict(second.headers or [])[REDRIVE_COUNT] == b"2"


def test_where_retention_removed_the_input_the_bytes_the_letter_carries_go() -> None:
    raw = base64.b64encode(b'{"comment":"hi"}').decode()
    [one] = plan([((DL, 0, 0), _letter(5, raw_b64=raw, raw_size=16))], {}, WORTH)
    assert (one.key, one.value, one.skipped) == (b"i5", b'{"comment":"hi"}', None)


def test_the_audit_counts_an_input_once_by_its_final_attempt() -> None:
    first, again, third, other = (IN, 0, 1), (IN, 0, 7), (IN, 1, 2), (IN, 0, 3)
    later = {again: (first, 1), third: (first, 2)}
    finals, superseded = final_attempts({first, again, third, other}, later)
    assert finals == {third, other} and superseded == {first, again}
    # a re-drive whose first attempt is outside the audited range stands for its input
    assert final_attempts({again}, later) == ({again}, set())


def test_what_the_plan_leaves_out_is_counted_by_why() -> None:
    letters = [
        ((DL, 0, 0), {"scope": "item", "code": "unanswered"}),
        ((DL, 0, 1), {"scope": "item", "code": "not_json"}),
        ((DL, 0, 2), {"scope": "item", "code": "not_json"}),
        ((DL, 0, 3), {"scope": "call", "code": "bad_arguments"}),
        ((DL, 0, 4), {"scope": "call", "code": "activity_failed"}),
    ]
    assert left_out(letters, ["unanswered"]) == {"call": 2, "not_json": 2}
    assert left_out(letters, ["unanswered", "not_json"]) == {"call": 2}
