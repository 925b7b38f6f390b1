"""asyncapi.yaml is generated from the message models (like schemas/) and must not drift;
its references must all resolve, and every topic the product writes is in it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from instanced_stream.ops.asyncapi import CHANNELS, render_asyncapi
from instanced_stream.settings import Topics

FILE = Path(__file__).resolve().parents[3] / "asyncapi.yaml"


def test_asyncapi_file_matches_the_models() -> None:
    assert FILE.read_bytes() == render_asyncapi(), (
        "asyncapi.yaml is out of date: run `stream schemas`"
    )


def _refs(node: Any) -> list[str]:
    if isinstance(node, dict):
        return [node["$ref"]] if "$ref" in node else [r for v in node.values() for r in _refs(v)]
    if isinstance(node, list):
        return [r for v in node for r in _refs(v)]
    return []


def test_every_reference_resolves() -> None:
    doc = yaml.safe_load(render_asyncapi())
    assert doc["asyncapi"] == "3.0.0"
    refs = _refs(doc)
    assert len(refs) > 30
    for ref in refs:
        node = doc
        for part in ref.removeprefix("#/").split("/"):
            assert part in node, f"{ref} does not resolve"
            node = node[part]


def test_channels_are_the_product_topics() -> None:
    topics = Topics("", "items")
    written = {
        topics.input,
        topics.dead_letter,
        topics.no_action,
        topics.state_updates,
        topics.ideas,
        topics.context,
        topics.advice,
        topics.results,
        topics.review,
        topics.done,
        topics.proposals,
        topics.approvals,
        topics.activity("{tool}"),
    }
    assert {address for address, *_ in CHANNELS.values()} == written
    doc = yaml.safe_load(render_asyncapi())
    header = doc["components"]["messages"]["ActivityRecord"]["headers"]["properties"]
    assert "traceparent" in header
