"""Topics are created in requests the broker accepts: a KRaft controller refuses one that
creates too many partitions at once ("Excessively large number of partitions per
request", measured: eleven topics of 1,024 partitions in one request), whole."""

from __future__ import annotations

from instanced_stream.kafka.topics import PARTITIONS_PER_REQUEST, topic_batches


def test_large_topics_go_in_several_requests_none_over_the_limit() -> None:
    names = [f"t{i}" for i in range(12)]
    batches = topic_batches(names, 1024)
    assert [n for b in batches for n in b] == names  # every topic, once, in order
    assert len(batches) > 1
    assert all(len(b) * 1024 <= PARTITIONS_PER_REQUEST for b in batches)
    # small topics stay in one request; a topic larger than the limit goes alone
    assert topic_batches(names, 4) == [names]
    assert topic_batches(["huge", "other"], 20_000) == [["huge"], ["other"]]
    assert topic_batches([], 1024) == []
