#!/usr/bin/env bash
# `make test`: start the parts of the stack that are not running, run the whole suite, and stop
# exactly the parts this script started -- also when tests fail. A part that fails to start is a
# failure of the run, never a skip.
source "$(dirname "$0")/lib.sh"
cd "$REPO"
started=()
for part in connect postgres kafka cassandra flink-jm flink-tm control-plane prometheus pushgateway jaeger; do
  running "$part" || started+=("$part")
done
cleanup() {
  local rc=$?
  for part in "${started[@]}"; do
    case "$part" in
      kafka) stop_part kafka 30 ;;
      cassandra) stop_part cassandra 40 ;;
      flink-jm) stop_part flink-jm 30 ;;
      flink-tm) stop_part flink-tm 30 ;;
      control-plane) stop_part control-plane 10 ;;
      connect) bash "$REPO/stack/connect.sh" stop ;;
      postgres) bash "$REPO/stack/postgres.sh" stop ;;
      prometheus) stop_part prometheus 20 ;;
      pushgateway) stop_part pushgateway 10 ;;
      jaeger) stop_part jaeger 10 ;;
    esac
  done
  exit $rc
}
trap cleanup EXIT
if [ "${1:-}" = "--chaos" ]; then
  # `make chaos`: the whole fault matrix (tests/faults/test_chaos.py), report in .run/chaos/, and the
  # operational events' TaskManager kill (no event emitted twice).
  bash "$REPO/stack/up.sh"
  set +e
  rm -rf "$REPO/.run/chaos"
  "$PY" -m pytest -q -s -p no:cacheprovider tests/faults/test_chaos.py \
    "tests/faults/test_config_path.py::test_with_the_control_plane_stopped_for_60s_existing_endpoints_keep_receiving_events" \
    "tests/integration/test_operational_events.py::test_a_taskmanager_kill_emits_no_operational_event_twice"
  rc=$?
  set -e
  exit $rc
fi
if [ "${1:-}" = "--chaos-cluster" ]; then
  # `make chaos-cluster`: rescale and node-loss faults (marker chaos_cluster), report in
  # .run/chaos-cluster/. They run against the stack that is up, named by WEBHOOKS_CHAOS_STACK.
  bash "$REPO/stack/up.sh"
  set +e
  rm -rf "$REPO/.run/chaos-cluster"
  WEBHOOKS_CHAOS_STACK="${WEBHOOKS_CHAOS_STACK:-default}" \
    "$PY" -m pytest -q -s -p no:cacheprovider -m chaos_cluster tests/faults/
  rc=$?
  set -e
  exit $rc
fi
say "lint: ruff, mypy, import contracts, doc links"
make -s -C "$REPO" lint || exit 1
bash "$REPO/stack/up.sh"
# The trace backend test_tracing reads its traces from, whether or not the stack traces (it builds
# Jaeger first if this machine has not yet: stack/jaeger.sh).
bash "$REPO/stack/jaeger.sh" start && bash "$REPO/stack/jaeger.sh" ready
set +e
# The fault matrix's long faults (minutes each) are `make chaos`, the rescale and node-loss faults
# `make chaos-cluster`; faults 1-4 run here.
# The slowest tests are listed at the end: the suite must stay well under 30 minutes on 2 cores.
# String hashing is seeded per process, and the driver iterates sets of delivery ids: fixed here so
# that the derandomized property and model tests explore the same cases in every run and a red run
# reproduces (export PYTHONHASHSEED=random, or another seed, to explore other orders).
export PYTHONHASHSEED="${PYTHONHASHSEED:-0}"
# Faults last: a fault test may replace the session's job (a rescale, a restore), whose operator
# metrics the integration tests read; pure tests first, so a broken build fails in seconds.
if [ $# -eq 0 ]; then set -- tests/unit tests/integration tests/e2e tests/faults; fi
"$PY" -m pytest -q -p no:cacheprovider --durations=40 -m "not chaos_full and not chaos_cluster and not cluster" "$@"
rc=$?
set -e
if [ $rc -eq 5 ]; then echo "no tests ran: that is a failure" >&2; rc=1; fi
exit $rc
