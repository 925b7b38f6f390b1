"""`${VAR}` / `${VAR:-default}` in agent specs."""

from __future__ import annotations

from pathlib import Path

import pytest
from instanced_stream.core.interpolate import interpolate
from instanced_stream.core.spec import load_spec
from instanced_stream.errors import SpecError

SPEC = Path(__file__).resolve().parents[3] / "examples" / "moderation" / "agent.yaml"


def test_values_are_filled_from_the_environment() -> None:
    env = {"MODEL": "gpt-x", "EMPTY": ""}
    data = {
        "name": "${MODEL}",
        "list": ["a-${MODEL}-b", "${MISSING:-fallback}", "${EMPTY:-used}", "${EMPTY-kept}"],
        "n": 3,
        "literal": "$${MODEL} costs $5",
    }
    assert interpolate(data, env) == {
        "name": "gpt-x",
        "list": ["a-gpt-x-b", "fallback", "used", ""],
        "n": 3,
        "literal": "${MODEL} costs $5",
    }


def test_an_unset_variable_without_default_is_named() -> None:
    with pytest.raises(SpecError, match=r"agent spec x: \$\{NOPE\} is not set"):
        interpolate({"a": "${NOPE}"}, {}, "agent spec x")


def test_load_spec_interpolates(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = SPEC.read_text().replace("name: stream-sim-1", "name: ${SPEC_MODEL:-stream-sim-1}")
    text = text.replace("timeout_s: 30", "timeout_s: ${SPEC_TIMEOUT:-30}")
    assert "${SPEC_MODEL" in text and "${SPEC_TIMEOUT" in text
    path = tmp_path / "agent.yaml"
    path.write_text(text)
    monkeypatch.delenv("SPEC_MODEL", raising=False)
    monkeypatch.setenv("SPEC_TIMEOUT", "12.5")
    spec = load_spec(path)
    assert (spec.model.name, spec.model.timeout_s) == ("stream-sim-1", 12.5)
    monkeypatch.setenv("SPEC_MODEL", "gpt-prod")
    assert load_spec(path).model.name == "gpt-prod"
