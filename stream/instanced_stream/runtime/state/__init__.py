"""The state of the units (docs/architecture.md, exactly once): the state store of one
unit, restored from the compacted changelog and changed only through the unit's
transactions (`store`); the reader of a store's changelog partition, which sets aside
the records it cannot read (`changelog`); the order of state changes, so compaction
keeps a state's newest snapshot (`changes`); and the read-back of a retired state's
changelog record by offset (`recall`). Who restores a store and resumes its workflows is
the pipeline's `restore`."""

__all__ = [
    "changelog",
    "changes",
    "recall",
    "store",
]
