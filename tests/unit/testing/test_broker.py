"""The local broker's data folder is removed whole, its partition folders in parallel."""

from __future__ import annotations

from pathlib import Path

from instanced_stream_bench.testing.broker import remove_tree


def test_remove_tree_removes_a_broker_data_folder(tmp_path: Path) -> None:
    root = tmp_path / "stream-kafka-x"
    for name in ("__consumer_offsets-0", "items-3", "__cluster_metadata-0"):
        part = root / "logs" / name
        part.mkdir(parents=True)
        for file in ("00000000000000000000.log", "00000000000000000000.index"):
            (part / file).write_bytes(b"x" * 100)
    (root / "server.properties").write_text("node.id=1\n")
    (root / "kafka.out").write_text("started\n")
    remove_tree(root)
    assert not root.exists()
    assert list(tmp_path.iterdir()) == []


def test_remove_tree_of_a_folder_already_gone_is_quiet(tmp_path: Path) -> None:
    remove_tree(tmp_path / "never-made")
