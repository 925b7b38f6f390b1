"""What declares itself context (a tool, an advisor, a plan, a global input) and the key
it is kept under on the context topic."""

from __future__ import annotations

from typing import Any

import pytest
from instanced_stream.core.context_kind import context_key, declared_kind


@pytest.mark.parametrize(
    ("payload", "key", "kind"),
    [
        ({"type": "plan"}, b"k", "plan"),
        ({"kind": "advisor"}, None, "advisor"),
        ({"type": "tool", "kind": "latent"}, None, "tool"),  # a tool's own kind is no kind
        ({"type": "input"}, None, "input"),
        ({"kind": "input"}, None, "input"),
        ({"type": "input", "_instance": "a"}, None, None),
        ({"type": "input"}, b"a", None),
        ({"type": "state"}, None, None),
        ({"type": "comment", "kind": "bug"}, b"a", None),
        ({}, None, None),
    ],
)
def test_the_kind_a_record_declares(payload: dict[str, Any], key: bytes | None, kind: str) -> None:
    assert declared_kind(payload, key) == kind


def test_each_kind_is_kept_under_what_it_names() -> None:
    assert context_key("advisor", {"id": "critic"}, "i/0/1") == "critic"
    assert context_key("tool", {"name": "think"}, "i/0/1") == "think"
    assert context_key("plan", {"mode": "lazy"}, "i/0/1") == "plan"
    assert context_key("input", {"name": "season"}, "i/0/1") == "season"
    # an unnamed global input replaces nothing: it is kept under where it came from
    assert context_key("input", {"note": "x"}, "i/0/1") == "input@i/0/1"
