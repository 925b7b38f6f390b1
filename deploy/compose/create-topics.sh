#!/bin/bash
# One-shot topic creation for docker-compose.yml (runs in the apache/kafka image).
# Inputs come from the compose service's environment: BOOTSTRAP, PARTITIONS,
# TOPICS and COMPACTED_TOPICS (space-separated names).
# --if-not-exists makes a re-run harmless; it never changes an existing topic, so
# raising STREAM_PARTITIONS later needs `kafka-topics.sh --alter` by hand.
set -euo pipefail
kt=/opt/kafka/bin/kafka-topics.sh

for topic in $TOPICS; do
    "$kt" --bootstrap-server "$BOOTSTRAP" --create --if-not-exists --topic "$topic" \
        --partitions "$PARTITIONS" --replication-factor 1
done
# Compacted topics keep the latest value per key: one partition, so every reader
# sees all keys in one order.
for topic in $COMPACTED_TOPICS; do
    "$kt" --bootstrap-server "$BOOTSTRAP" --create --if-not-exists --topic "$topic" \
        --partitions 1 --replication-factor 1 --config cleanup.policy=compact
done
"$kt" --bootstrap-server "$BOOTSTRAP" --list
