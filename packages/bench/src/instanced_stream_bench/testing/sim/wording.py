"""What the simulator writes in its answers' free text, per the answer form the prompt
asks for: the protocol form's sentences, or the compact form's short ones (its prompt asks
for free text "as short as its reader needs" and reasoning that does not repeat the
arguments)."""

from __future__ import annotations

from instanced_stream.core.compact import REASONING

__all__ = ["reasoning_for", "reasoning_of", "why_for"]


def reasoning_of(system: str, fields: dict[str, list[str]]) -> str:
    """The reasoning a request asks for, read as a model reads it: from its prompt."""
    asked = any(REASONING in f for f in fields.values()) if fields else f'"{REASONING}"' in system
    if not asked:
        return "off"
    return "brief" if "at most ten words" in system else "full"


def why_for(spam: bool, flagged: bool, terse: bool) -> str:
    """The decision's reason; terse where the prompt asks for short free text."""
    if not flagged:
        return "within the rules" if terse else "within the community rules"
    if spam:
        return "spam"
    return "insults or profanity" if terse else "insulting or profane language"


def reasoning_for(
    compact: dict[str, list[str]], reasoning: str, score: float, why: str, spam: bool, flagged: bool
) -> str:
    """A call's reasoning as each setting asks: the protocol form's sentence; compact
    full says what the arguments do not (the exact score, and what tipped it: distinct
    per instance, as a model's own words would be); brief the rounded score."""
    if not compact:
        return f"toxicity {score:.2f}; {why}"
    if reasoning == "brief":
        return f"toxicity {score:.2f}"
    tipped = "spam pattern" if spam else ("classifier" if flagged else "no flags")
    return f"toxicity {score:.3f}; {tipped}"
