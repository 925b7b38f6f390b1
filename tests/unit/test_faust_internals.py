"""The processor caps faust's commits through a private method (`_cap_commits` in
instanced_stream/runtime/app.py replaces `Consumer._new_offset`). faust offers no public hook, so
these tests pin exactly what is relied on and fail loudly when an upgrade changes it:
then re-read the two methods, check that the cap still sits on every commit path, and
update the fingerprints below."""

from __future__ import annotations

import hashlib
import importlib.metadata
import inspect
import tomllib
from pathlib import Path

import pytest
from faust.transport.consumer import Consumer
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]

# sha256 (first 16 hex digits) of each method's source in faust-streaming 0.15.3.
FINGERPRINTS = {
    "_new_offset": "1d2c7ea89a7ad4f1",
    "_filter_committable_offsets": "dc5e9baf5d994485",
}


def _faust_requirement() -> Requirement:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (found,) = [Requirement(d) for d in deps if Requirement(d).name == "faust-streaming"]
    return found


def test_faust_is_pinned_below_the_next_minor_release() -> None:
    requirement = _faust_requirement()
    assert any(s.operator == "<" for s in requirement.specifier), (
        "faust-streaming needs an upper bound: its private commit path is patched"
    )
    installed = importlib.metadata.version("faust-streaming")
    assert requirement.specifier.contains(installed), installed


@pytest.mark.parametrize("method", sorted(FINGERPRINTS))
def test_patched_commit_internals_are_unchanged(method: str) -> None:
    source = inspect.getsource(getattr(Consumer, method))
    digest = hashlib.sha256(source.encode()).hexdigest()[:16]
    assert digest == FINGERPRINTS[method], (
        f"faust's Consumer.{method} changed (faust-streaming "
        f"{importlib.metadata.version('faust-streaming')}): the commit cap of "
        "instanced_stream/runtime/app.py `_cap_commits` may no longer apply; re-check it"
    )


def test_every_commit_goes_through_new_offset() -> None:
    """The cap works only if the commit path asks `_new_offset` per partition."""
    signature = inspect.signature(Consumer._new_offset)
    assert list(signature.parameters) == ["self", "tp"]
    assert "self._new_offset(tp)" in inspect.getsource(Consumer._filter_committable_offsets)
    assert "_filter_committable_offsets" in inspect.getsource(Consumer._commit_tps)


def test_the_committed_offset_it_sought_to_is_kept_where_continuity_reads_it() -> None:
    """instanced_stream/runtime/continuity.py starts a partition where faust sought it: the
    committed offset kept in `Consumer._committed_offset` by `perform_seek`."""
    assert "self._committed_offset.update(" in inspect.getsource(Consumer.perform_seek)
    assert "self._committed_offset = " in inspect.getsource(Consumer.__init__)


def test_the_partition_holds_continuity_reports_are_where_it_reads_them() -> None:
    """instanced_stream/runtime/app.py `_Watched.held` names why faust does not fetch a partition
    from `flow_active`, `_paused_partitions` and `_active_partitions`, the sets faust's
    own fetch reads."""
    fetch = inspect.getsource(Consumer._wait_next_records)
    assert "self.flow_active" in fetch and "self._get_active_partitions()" in fetch
    active = inspect.getsource(Consumer._set_active_tps)
    assert "self._active_partitions" in active and "self._paused_partitions" in active
    assert "self._paused_partitions.difference_update" in inspect.getsource(
        Consumer.resume_partitions
    )
