"""Pipeline steps with no Kafka client in them: records to instances (`intake`), what a
window may hold (`window_size`, its one author) and the windows themselves (`windowing`),
a solved batch to its records (`records`), dead letters (`letters`) and the size guard of
the records a workflow writes (`size_guard`), and the context an activity may see
(`scopes`)."""

__all__ = [
    "intake",
    "letters",
    "records",
    "scopes",
    "size_guard",
    "window_size",
    "windowing",
]
