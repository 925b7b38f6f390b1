"""Sample comments for the demo, tests and benchmarks: clean, toxic and spam, with a few
records that are broken on purpose."""

from __future__ import annotations

import random

import orjson

__all__ = ["comments", "malformed_records", "tickets"]

_CLEAN = [
    "Thanks for writing this up, the section on retries saved me an afternoon.",
    "I disagree with the conclusion, but the benchmark methodology is solid.",
    "Does this also work with three brokers, or only with one?",
    "Great post! Looking forward to the follow-up on partition scaling.",
    "We tried the same approach last year and latency dropped by half.",
    "Could you share the config you used for the consumer group?",
    "Nice photos from the meetup, wish I could have been there.",
    "The second chart is hard to read on mobile, maybe use a table?",
    "My team switched to this library and the on-call load went down.",
    "Interesting take. I think the trade-off depends on message size.",
]
_TOXIC = [
    "You are a complete idiot and nobody wants your stupid opinion.",
    "Shut up, you worthless moron.",
    "This is the dumbest shit I have ever read, the author is a fucking clown.",
    "Go to hell, loser.",
]
_SPAM = [
    "BUY NOW!!! Cheap watches at www.example-deals.test limited offer",
    "Earn 5000 dollars a week from home, click here https://spam.example.test",
    "Subscribe to my channel for free money $$$",
]
# Blunt but not clearly abusive: where a lenient and a strict advisor part ways.
_BORDERLINE = [
    "Stop spreading this garbage.",
    "This damn API keeps timing out.",
    "You clearly have no clue what you are talking about.",
]
_TOPICS = ["Kafka", "the new release", "this tutorial", "the API", "the roadmap", "batching"]


def comments(n: int, seed: int = 1) -> list[dict[str, str]]:
    """n comment items with ids c-000001..; about 70% clean, 5% borderline, 15% toxic,
    10% spam."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        draw = rng.random()
        pool = (
            _CLEAN
            if draw < 0.7
            else _BORDERLINE
            if draw < 0.75
            else _TOXIC
            if draw < 0.9
            else _SPAM
        )
        text = f"{rng.choice(pool)} (re: {rng.choice(_TOPICS)})"
        out.append({"_instance": f"c-{i + 1:06d}", "comment": text, "author": f"user{i % 97}"})
    return out


def malformed_records(max_bytes: int) -> list[tuple[bytes | None, bytes, str]]:
    """(key, value, expected dead-letter code) for records that must be dead-lettered."""
    big = orjson.dumps({"_instance": "huge-1", "comment": "x" * (max_bytes + 10)})
    return [
        (b"bad-1", b"{this is not json", "not_json"),
        (b"bad-2", b"[1, 2, 3]", "not_object"),
        (None, orjson.dumps({"comment": "who wrote me? no _instance and no key"}), "no_instance"),
        (b"bad-4", big, "too_large"),
    ]


_SUBJECTS = [
    ("Site is down for all our users", "Since 9:00 every page returns 502. Please help asap."),
    ("Cannot log in after password reset", "The reset mail arrives but login still fails."),
    ("Question about invoices", "Could you send last month's invoice as PDF?"),
    ("Feature idea: dark mode", "Would love a dark theme for the dashboard."),
    ("Export is slow", "CSV export of 10k rows takes a minute; not blocking."),
]
_CUSTOMERS = ["acme", "globex", "initech", "umbrella", "hooli", "vandelay"]


def tickets(n: int, seed: int = 3) -> list[dict[str, str]]:
    """n support tickets with ids t-000001..: some urgent, some from VIP customers."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        subject, body = rng.choice(_SUBJECTS)
        out.append(
            {
                "_instance": f"t-{i + 1:06d}",
                "customer": rng.choice(_CUSTOMERS),
                "subject": subject,
                "body": body,
            }
        )
    return out
