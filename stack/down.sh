#!/usr/bin/env bash
# Stop everything the stack scripts started, by the pids they recorded. Data stays in .run/
# (`make clean` removes it).
source "$(dirname "$0")/lib.sh"
"$REPO/stack/job.sh" cancel-all || true
stop_part receiver 5
"$REPO/stack/archive.sh" stop
"$REPO/stack/control_plane.sh" stop  # every replica
"$REPO/stack/flink.sh" stop  # every TaskManager (also those `flink.sh add-tm` added), then the JobManager
"$REPO/stack/connect.sh" stop
"$REPO/stack/postgres.sh" stop
"$REPO/stack/cassandra.sh" stop  # every node of the topology
"$REPO/stack/kafka.sh" stop
"$REPO/stack/prometheus.sh" stop
"$REPO/stack/jaeger.sh" stop  # if it runs (tracing on); its traces were in memory only
say "stack stopped (topology $TOPOLOGY)"
