from __future__ import annotations

from pathlib import Path

from instanced_stream.ops.schemas import render

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"


def test_schemas_folder_matches_the_models() -> None:
    rendered = render()
    on_disk = {p.name: p.read_bytes() for p in SCHEMAS.glob("*.json")}
    stale = sorted(n for n in rendered if on_disk.get(n) != rendered[n])
    extra = sorted(set(on_disk) - set(rendered))
    assert not stale and not extra, (
        f"schemas/ is out of date (stale {stale}, extra {extra}): run `stream schemas`"
    )
