"""What comes out of one request, with no Kafka client in it: a solved batch to the
records that say what became of each item (`records`), dead letters (`letters`), the
size guard of the records a workflow writes (`size_guard`), and the context an activity
may see (`scopes`), and the one counter of what records mean (`tally`)."""

__all__ = [
    "letters",
    "records",
    "scopes",
    "size_guard",
    "tally",
]
