"""The pipeline: consumed records to outcomes staged on their units (docs/architecture.md).
Admission reads records (parsed by `intake`) and next turns into items (`admission`),
the stager connects the stages and their cross-partition windows (`stager`), dispatch
solves each closed window (`dispatch`), staging writes every outcome onto the units of
its items' partitions (`staging`); a record of an instance that lives elsewhere is sent
on (`forwarding`); results and approvals are routed (`replies`); the workflow turns
on their way (`queued_turns`); the instances it batches and the outcomes known at once
(`staged`); what every stage reads, one frozen value (`shared`); the tier it is given
(`tier`: online, or the Batch API's); workflows' results, approvals, turns and deadlines
as staged state changes (`workflows`); the restore of a unit's store and the workflows
it resumes (`restore`); and the compacted context topic (`overrides`). Two rooms below
need no broker: `windows` (what goes into a request) and `outcomes` (what comes out of
one); they sit on the lowest floor of `runtime`, so `quality` can read the window's
size."""

__all__ = [
    "admission",
    "dispatch",
    "forwarding",
    "intake",
    "outcomes",
    "overrides",
    "queued_turns",
    "replies",
    "restore",
    "shared",
    "staged",
    "stager",
    "staging",
    "tier",
    "windows",
    "workflows",
]
