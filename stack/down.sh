#!/usr/bin/env bash
# Stop everything the stack scripts started, by the pids they recorded. Data stays in .run/
# (`make clean` removes it).
source "$(dirname "$0")/lib.sh"
"$REPO/stack/job.sh" cancel-all || true
stop_part receiver 5
stop_part control-plane 10
stop_part flink-tm 30
stop_part flink-jm 30
stop_part cassandra 40
stop_part kafka 30
say "stack stopped"
