"""The bench's spec variants: the example with its advisors, and with its shared prefix
just over the 1,024-token cache minimum."""

from __future__ import annotations

from instanced_stream.core.cache_rule import preset_rule
from instanced_stream_bench.harness.bench import bench_spec
from instanced_stream_bench.harness.spec_variants import (
    RULES,
    over_minimum,
    shared_tokens,
    with_advisors,
)


def test_the_prefix_variant_passes_the_minimum_by_less_than_one_step() -> None:
    plain = bench_spec()
    grown = over_minimum(plain)
    assert shared_tokens(plain) < 1024 < shared_tokens(grown) < 1024 + 128
    # OpenAI's rule caches 1,024 of it: the baseline's best case
    assert preset_rule("openai-0.1x").cacheable(shared_tokens(grown)) == 1024
    # what grew is the instructions, by whole rules of the example's policy
    added = grown["instructions"][len(plain["instructions"].rstrip()) :].strip().splitlines()
    assert added and all(line in RULES for line in added)
    assert grown["tools"] == plain["tools"] and "advisors" not in grown
    assert plain["instructions"] == bench_spec()["instructions"]  # the input is not changed


def test_a_spec_already_over_the_minimum_is_left_as_it_is() -> None:
    advised = with_advisors()
    assert [a["id"] for a in advised["advisors"]] == [
        "safetyOfficer",
        "communityManager",
        "legalCounsel",
    ]
    assert all("on" in a for a in advised["advisors"])  # YAML's `on:` read as a key
    assert shared_tokens(advised) > 1024
    assert over_minimum(advised) == advised
