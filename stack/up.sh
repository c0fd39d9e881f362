#!/usr/bin/env bash
# Start the local stack (Kafka, Cassandra, Flink, control plane), create topics and apply the
# schema. Every part waits for real readiness; starting twice is harmless.
source "$(dirname "$0")/lib.sh"
cd "$REPO"
"$REPO/stack/kafka.sh" start
"$REPO/stack/cassandra.sh" start
"$REPO/stack/flink.sh" start
"$REPO/stack/kafka.sh" ready
"$PY" -m stack.topics || fail "could not create kafka topics"
"$REPO/stack/cassandra.sh" ready
"$PY" -m stack.cassandra_schema || fail "could not apply the cassandra schema"
"$REPO/stack/control_plane.sh" start
"$REPO/stack/flink.sh" ready
"$REPO/stack/control_plane.sh" ready
