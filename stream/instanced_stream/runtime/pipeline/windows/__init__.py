"""What goes into one request, with no Kafka client in it: items of the same content
asked once (`twins`); what a
window may hold (`window_size`, its one author) and the windows themselves, closed at
their size or their wait (`windowing`); and the spend ceiling each request waits on
(`spend`)."""

__all__ = [
    "spend",
    "twins",
    "window_size",
    "windowing",
]
