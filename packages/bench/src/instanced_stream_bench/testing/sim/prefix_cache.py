"""The simulator's prompt-prefix cache: what a provider's cache would serve of each request.

The shared prefix is the system message (the product puts everything windows share
there, first). Its `cached_tokens` follow the configured rule (`SimConfig.cache`), so a
prefix under OpenAI's 1,024-token minimum is reported uncached however often it
repeats; beside it, every preset's reads and writes are counted for the same requests
(`cache_read:<preset>`, `cache_written:<preset>` in /sim/stats), so a bench prices one
run under every provider's rule: the tokens are the same, only the bill differs.
"""

from __future__ import annotations

from collections import Counter

from instanced_stream.core.cache_rule import PRESETS, CacheRule

__all__ = ["PrefixCache"]

# The system message's own framing tokens (role and separators), as the prompt counts them.
_FRAMING = 3


class PrefixCache:
    def __init__(self) -> None:
        self._seen: set[bytes] = set()

    def serve(
        self, key: bytes, system_tokens: int, rule: CacheRule, stats: Counter[str], tier: str = ""
    ) -> int:
        """One request whose shared prefix hashes to `key`: counts every preset's reads
        and writes into `stats` (`tier`: "batch_" for Batch API lines) and returns the
        cached tokens `rule` reports."""
        prefix = system_tokens + _FRAMING
        seen = key in self._seen
        if len(self._seen) > 10_000:  # a long-running simulator: forget, as caches expire
            self._seen.clear()
        self._seen.add(key)
        for name, preset in PRESETS.items():
            use = preset.rule.use(prefix, seen)
            stats[f"{tier}cache_read:{name}"] += use.read
            stats[f"{tier}cache_written:{name}"] += use.written
        return rule.use(prefix, seen).read
