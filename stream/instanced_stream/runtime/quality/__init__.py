"""Quality control of the decisions: the shadow sample asked at a smaller window
(`shadow`), the escalation of low-agreement items (`escalation`), and `control`, which
wires both to the window. (Calls held for a person are the `review` topic's, not this.)"""

__all__ = [
    "control",
    "escalation",
    "shadow",
]
