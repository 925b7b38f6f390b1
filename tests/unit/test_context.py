from __future__ import annotations

import orjson

from stream.core.overrides import apply_overrides
from stream.core.spec import load_spec
from stream.settings import DEFAULT_SPEC


def _msg(data: object) -> bytes:
    return orjson.dumps(data)


def test_context_advisors_and_inputs_merge_and_bad_ones_are_refused_by_name() -> None:
    spec = load_spec(DEFAULT_SPEC)
    messages: dict[str, bytes | None] = {
        "brandGuardian": _msg(
            {
                "type": "advisor",
                "id": "brandGuardian",
                "role": "Guard the brand",
                "on": "request",
                "weight": 0.5,
            }
        ),
        "safetyOfficer": _msg(
            {
                "type": "advisor",
                "id": "safetyOfficer",
                "role": "stricter now",
                "on": "request",
                "isInstanced": True,
                "weight": 3,
            }
        ),
        "brokenAdvisor": _msg(
            {"type": "advisor", "id": "brokenAdvisor", "role": "r", "on": "always"}
        ),
        "badSchema": _msg(
            {
                "type": "advisor",
                "id": "badSchema",
                "role": "r",
                "on": "start",
                "schema": {"type": "array"},
            }
        ),
        "season": _msg({"type": "input", "note": "holiday season: expect more spam"}),
        "targeted": _msg({"type": "input", "_instance": "c-1", "note": "not global"}),
        "garbage": b"{nope",
        "removed": None,
    }
    merged, refused = apply_overrides(spec, messages)
    ids = [a.id for a in merged.advisors]
    assert "brandGuardian" in ids and "brokenAdvisor" not in ids and "badSchema" not in ids
    assert merged.advisor("safetyOfficer") is not None
    assert merged.advisor("safetyOfficer").weight == 3  # type: ignore[union-attr]
    assert any(
        m.model_extra and m.model_extra.get("note", "").startswith("holiday") for m in merged.inputs
    )
    reasons = dict(refused)
    assert set(reasons) == {"brokenAdvisor", "badSchema", "targeted", "garbage"}
    assert "brokenAdvisor" in reasons["brokenAdvisor"] and ".on" in reasons["brokenAdvisor"]
    assert "advisor 'badSchema': schema" in reasons["badSchema"]
    assert "not JSON" in reasons["garbage"]


def test_no_context_leaves_the_spec_as_it_was() -> None:
    spec = load_spec(DEFAULT_SPEC)
    merged, refused = apply_overrides(spec, {})
    assert merged == spec and refused == []
