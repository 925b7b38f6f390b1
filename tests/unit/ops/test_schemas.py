from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from instanced_stream.core.spec import spec_document
from instanced_stream.ops.schemas import render
from jsonschema import Draft202012Validator

ROOT = Path(__file__).resolve().parents[3]
SCHEMAS = ROOT / "schemas"


def test_schemas_folder_matches_the_models() -> None:
    rendered = render()
    on_disk = {p.name: p.read_bytes() for p in SCHEMAS.glob("*.json")}
    stale = sorted(n for n in rendered if on_disk.get(n) != rendered[n])
    extra = sorted(set(on_disk) - set(rendered))
    assert not stale and not extra, (
        f"schemas/ is out of date (stale {stale}, extra {extra}): run `stream schemas`"
    )


SHIPPED = sorted(
    [*ROOT.glob("examples/**/*.yaml"), *ROOT.glob("deploy/**/agent.yaml")],
    key=str,
)


def test_the_spec_schema_is_the_input_schema() -> None:
    schema = orjson.loads((SCHEMAS / "agent-spec.json").read_bytes())
    Draft202012Validator.check_schema(schema)
    advisor = schema["$defs"]["Advisor"]["properties"]
    assert "kind" in advisor and "type" in advisor  # the seeds' two spellings
    assert {"_output", "output"} <= set(schema["$defs"]["Tool"]["properties"])


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_shipped_spec_validates_against_the_schema(path: Path) -> None:
    validator = Draft202012Validator(orjson.loads((SCHEMAS / "agent-spec.json").read_bytes()))
    problems = [
        f"{'.'.join(str(p) for p in e.absolute_path)}: {e.message}"
        for e in validator.iter_errors(spec_document(path))
    ]
    assert not problems, problems


def test_the_shipped_specs_are_all_found() -> None:
    assert len(SHIPPED) >= 8


def test_the_schema_refuses_what_the_loader_refuses() -> None:
    validator = Draft202012Validator(orjson.loads((SCHEMAS / "agent-spec.json").read_bytes()))
    spec = spec_document(ROOT / "examples" / "moderation" / "agent.yaml")
    assert not list(validator.iter_errors(spec))
    assert list(validator.iter_errors({**spec, "windw": {}}))  # a misspelt section
    assert list(validator.iter_errors({**spec, "tools": "moderateComment"}))
