"""The protocol core: everything the seeds define, testable in memory.

Pure by rule: nothing here imports faust, aiokafka, aiohttp or openai (a unit test
checks it). The model is reached through the `Model` protocol in `solve`.

Modules (imported where used, so the activity workers' package, which needs only
`messages` and `spec`, ships and loads nothing else): `spec` (the agent spec),
`messages` (every record's model), `instance`, `prompt`, `compact` (the compact answer
form), `validate`, `solve`, `model`, `advice`, `workflow`, `binding`, `state`, `expiry`,
`overrides`, `context_kind` (what declares itself a context message), `tokenizer`,
`strict_form`, `interpolate`, `endpoint` (the model's options), `quality` (the shadow
sample and the window's agreement), `decision` (what counts as the same decision),
`controller` (the window that follows agreement), `keyed` (the keyed answer form),
`wire` (the Schema Registry wire format), `subjects` (the output topics' JSON Schemas as
registry subjects).
"""

__all__ = [
    "advice",
    "binding",
    "compact",
    "context_kind",
    "controller",
    "decision",
    "endpoint",
    "expiry",
    "instance",
    "interpolate",
    "keyed",
    "messages",
    "model",
    "overrides",
    "prompt",
    "quality",
    "solve",
    "spec",
    "state",
    "strict_form",
    "subjects",
    "tokenizer",
    "validate",
    "wire",
    "workflow",
]
