"""The partition rule of results and approvals (docs/contracts.md): one that arrived on
another partition than its instance's input is refused, whether the record says so itself
(a result's source.partition) or the instance lives in another owned partition."""

from __future__ import annotations

from instanced_stream.runtime.pipeline.answers import misrouted


def test_a_result_naming_another_partition_is_misrouted() -> None:
    reason = misrouted("result", "t-1", declared=2, partition=0, home=None)
    assert reason is not None
    assert "arrived on partition 0" in reason and "partition 2" in reason
    assert "source.partition" in reason


def test_an_instance_stored_in_another_owned_partition_is_misrouted() -> None:
    reason = misrouted("approval", "t-1", declared=None, partition=1, home=3)
    assert reason is not None and "partition 3" in reason


def test_the_right_partition_passes() -> None:
    assert misrouted("result", "t-1", declared=2, partition=2, home=2) is None
    assert misrouted("approval", "t-1", declared=None, partition=2, home=2) is None
    # Unknown here (owned by another processor, or ended): the binding rules decide.
    assert misrouted("approval", "t-1", declared=None, partition=2, home=None) is None
