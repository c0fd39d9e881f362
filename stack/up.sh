#!/usr/bin/env bash
# Start the local stack (Kafka, Cassandra, Flink, control plane, PostgreSQL with the outbox and the
# Kafka Connect worker streaming it, Prometheus and its Pushgateway; Jaeger when tracing is on),
# create topics and apply the schemas. Every part waits for real readiness; starting twice is harmless.
source "$(dirname "$0")/lib.sh"
cd "$REPO"
record_topology  # TOPOLOGY=cluster: stack/topologies/cluster.env (lib.sh refused it if another one runs)
record_tracing   # TRACING=1/0, remembered for job, status and the next up
say "topology: $TOPOLOGY$(tracing_on && echo ", tracing on")"
if tracing_on; then "$REPO/stack/jaeger.sh" start; fi  # first, so the first spans find it
"$REPO/stack/prometheus.sh" start
"$REPO/stack/kafka.sh" start
"$REPO/stack/cassandra.sh" start
"$REPO/stack/flink.sh" start
"$REPO/stack/postgres.sh" start
"$REPO/stack/postgres.sh" ready
"$PY" -m outbox.migrate || fail "could not migrate the outbox database"
"$REPO/stack/kafka.sh" ready
"$PY" -m stack.topics || fail "could not create kafka topics"
"$REPO/stack/connect.sh" start
"$REPO/stack/cassandra.sh" ready
"$PY" -m stack.cassandra_schema || fail "could not apply the cassandra schema"
"$REPO/stack/control_plane.sh" start
"$REPO/stack/flink.sh" ready
"$REPO/stack/control_plane.sh" ready
"$REPO/stack/connect.sh" ready
"$REPO/stack/prometheus.sh" ready
if tracing_on; then "$REPO/stack/jaeger.sh" ready; fi
