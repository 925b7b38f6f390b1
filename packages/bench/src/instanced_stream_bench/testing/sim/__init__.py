"""The LLM simulator: an OpenAI-compatible server (`server`) that reads our request
(`request`) and decides with a trained classifier and rules (`judge`, `keyed_judge`,
`planner`, `routing`, `wording`), behaves like a provider account (`account`, `quota`,
`provider`), serves a Batch API (`batch_api`), and can be told to disobey (`obedience`,
`disagree`). A simulator, labelled so everywhere; not a model."""

__all__ = [
    "account",
    "batch_api",
    "disagree",
    "judge",
    "keyed_judge",
    "obedience",
    "planner",
    "provider",
    "quota",
    "request",
    "routing",
    "server",
    "wording",
]
