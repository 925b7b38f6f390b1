"""What the stages share (runtime/pipeline/shared.py) is one value: admission and dispatch
read the same window size and the same turns on their way (a turn admission adds must be
the one dispatch marks done), and the value cannot be changed under them."""

from __future__ import annotations

import dataclasses

import pytest
from instanced_stream.core.spec import load_spec
from instanced_stream.settings import DEFAULT_SPEC

from tests.flows import Rig


def test_admission_and_dispatch_are_built_on_one_shared_value() -> None:
    stager = Rig(load_spec(DEFAULT_SPEC)).stager
    assert stager.admission.queued_turns is stager.dispatch.queued_turns is stager.queued_turns
    assert stager.admission.size is stager.dispatch.size is stager.size
    assert stager.admission.live is stager.dispatch.live


def test_the_shared_value_is_frozen() -> None:
    from instanced_stream.runtime.pipeline.shared import Shared

    stager = Rig(load_spec(DEFAULT_SPEC)).stager
    shared = Shared(
        stager.dispatch.settings,
        stager.dispatch.live,
        stager.metrics,
        stager.builder,
        None,
        stager.size,
        stager.tokenizer,
        stager.queued_turns,
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        shared.flows = stager.flows  # type: ignore[misc]
