"""The example's spec as the bench runs it beside the one-decision spec: with its advisors
as the example ships them, and with its shared prefix just over OpenAI's and Anthropic's
1,024-token cache minimum (the case where the per-item baseline gains most from a cache).

The second writes the example's community rules out in full, a paragraph at a time, until
the request's shared part (the system message) passes the minimum: a policy a real
moderation team would send, not filler the model is told to ignore.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from instanced_stream.core.prompt import PromptBuilder
from instanced_stream.core.spec import AgentSpec, spec_document
from instanced_stream.core.tokenizer import estimate_tokens
from instanced_stream.settings import DEFAULT_SPEC

__all__ = ["RULES", "over_minimum", "shared_tokens", "with_advisors"]

# The example's rules ("no insults, harassment or profanity aimed at people, no spam"),
# spelt out as a moderation policy.
RULES = (
    "Rule 1, insults: reject a comment that calls a person or a group stupid, worthless, "
    "ugly or any similar name, even when it is phrased as a joke or a question. Criticism "
    "of an idea, a product or a decision is allowed, however blunt.",
    "Rule 2, harassment: reject threats, wishes of harm, doxxing (addresses, phone numbers, "
    "workplaces of private people), and repeated targeting of one member across comments. "
    "Quoting a threat in order to report it is allowed.",
    "Rule 3, profanity: swearing as emphasis is allowed; profanity aimed at a person is an "
    "insult (rule 1). Slurs about ethnicity, religion, gender, sexuality or disability are "
    "always rejected, also when written with symbols or misspellings.",
    "Rule 4, spam: reject links to shops, referral codes, crypto offers, 'buy now' or "
    "'limited offer' language, and the same promotional text posted again. A link to a "
    "source that supports the comment's point is allowed.",
    "Rule 5, context: judge the comment as a reader of the thread would. Sarcasm that "
    "clearly mocks a person is an insult; sarcasm about a situation is allowed. A comment "
    "in another language follows the same rules.",
    "Rule 6, doubt: when a comment could be read either way, approve it and say in the "
    "reason what made you hesitate, so a moderator can look again. Never reject only "
    "because the comment is short, rude about a product, or off topic.",
    "Rule 7, notes to authors: when you reject, the note to the author names the rule in "
    "one polite sentence, without repeating the offending words, and says the comment may "
    "be posted again without them.",
    "Rule 8, privacy: never repeat personal data from a comment in a reason or a note; "
    "write 'personal data' instead. Do not guess who an author is.",
)


def with_advisors(path: Path = DEFAULT_SPEC) -> dict[str, Any]:
    """The example as it ships: its council of advisors and its advice settings."""
    spec: dict[str, Any] = spec_document(path)  # YAML's `on:` read as the key it is
    return spec


def shared_tokens(spec: dict[str, Any]) -> int:
    """The tokens of a spec's shared prefix: the system message every window sends."""
    return estimate_tokens(PromptBuilder(AgentSpec.model_validate(spec)).system)


def over_minimum(spec: dict[str, Any], minimum: int = 1024) -> dict[str, Any]:
    """`spec` with its rules written out until the shared prefix passes `minimum` tokens.
    A spec already over it comes back as it is."""
    grown = copy.deepcopy(spec)
    base = str(grown["instructions"]).rstrip()
    rules = iter(RULES)
    while shared_tokens(grown) <= minimum:
        rule = next(rules, None)
        if rule is None:
            raise ValueError(f"the example's rules do not reach {minimum} shared tokens")
        base += "\n" + rule
        grown["instructions"] = base + "\n"
    return grown
