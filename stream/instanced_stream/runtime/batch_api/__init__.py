"""The provider's Batch API tier: submissions of solved-later windows (`submissions`)
and the ledger that remembers them across restarts (`ledger`)."""

__all__ = [
    "ledger",
    "submissions",
]
