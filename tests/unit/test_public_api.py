"""The exactly-once core uses its libraries through their public API only (issue 24):
no private attribute or method of faust, mode or aiokafka (or anything but the object's
own) is read, patched or wrapped there. The faust-based path still does, in the modules
listed below, which leave with it; the list may only shrink."""

from __future__ import annotations

import ast
from pathlib import Path

STREAM = Path(__file__).resolve().parents[2] / "instanced_stream"

# The faust-based at-least-once path: reads and replaces faust's private internals
# (pinned by tests/unit/test_faust_internals.py) until the units replace it.
LEGACY = {"runtime/app.py", "runtime/feed.py"}


def _private_uses(path: Path) -> list[str]:
    """`x._name` where x is not `self` or `cls`: someone else's private attribute."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Attribute):
            continue
        name = node.attr
        if not name.startswith("_") or (name.startswith("__") and name.endswith("__")):
            continue
        owner = node.value
        if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
            continue
        found.append(f"{path.relative_to(STREAM)}:{node.lineno}: .{name}")
    return found


def test_no_private_attribute_of_another_object_outside_the_legacy_path() -> None:
    found = [
        use
        for path in sorted(STREAM.rglob("*.py"))
        if str(path.relative_to(STREAM)) not in LEGACY
        for use in _private_uses(path)
    ]
    assert not found, found


def test_the_legacy_list_names_modules_that_still_need_it() -> None:
    # A module that no longer reaches into a library leaves the list.
    for rel in LEGACY:
        assert _private_uses(STREAM / rel), f"{rel} is clean: take it off LEGACY"
