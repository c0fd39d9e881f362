# Shared helpers for the local stack scripts. Sourced, not run.
# Every server binds 127.0.0.1, keeps its data/logs/pid under .run/<part>/, and is stopped by the
# pid we recorded when we started it (never by name), so other users' processes are never touched.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
RUN="${WEBHOOKS_RUN_DIR:-$REPO/.run}"
JARS="$REPO/stack/.jars"
VENV="$REPO/.venv"
PY="$VENV/bin/python"
export TMPDIR="$RUN/tmp"
mkdir -p "$RUN/tmp"

say()  { printf '\033[1m[stack]\033[0m %s\n' "$*"; }
fail() { printf '\033[31m[stack] %s\033[0m\n' "$*" >&2; exit 1; }

# The topology: "single" (the default, one of each server) or a file stack/topologies/<name>.env
# ("cluster": 3 Kafka brokers, a 3-node Cassandra ring, 2 TaskManagers, 2 control planes). Same
# code, same job: the file only sets WEBHOOKS_* variables, each one the environment does not set
# already. Chosen once with TOPOLOGY=<name> (make up TOPOLOGY=cluster); up.sh records it in
# $RUN/topology, so status, job and down act on the topology that was started.
load_env_file() {
  local line key
  while IFS= read -r line || [ -n "$line" ]; do
    case "$line" in ''|'#'*) continue ;; esac
    key="${line%%=*}"
    [ -n "${!key+x}" ] || export "$key=${line#*=}"
  done < "$1"
}
TOPOLOGY_RECORDED="$(cat "$RUN/topology" 2>/dev/null || echo single)"
TOPOLOGY="${TOPOLOGY:-$TOPOLOGY_RECORDED}"
if [ "$TOPOLOGY" != single ]; then
  [ -f "$REPO/stack/topologies/$TOPOLOGY.env" ] \
    || fail "unknown TOPOLOGY '$TOPOLOGY': single, or one of stack/topologies/*.env"
  load_env_file "$REPO/stack/topologies/$TOPOLOGY.env"
fi
# Servers per part (the topology's file sets them): one part "kafka", or kafka-1..N, and so on.
KAFKA_NODES="${WEBHOOKS_KAFKA_NODES:-1}"
CASSANDRA_NODES="${WEBHOOKS_CASSANDRA_NODES:-1}"
FLINK_TASKMANAGERS="${WEBHOOKS_FLINK_TASKMANAGERS:-1}"
CONTROL_PLANES="${WEBHOOKS_CONTROL_PLANE_REPLICAS:-1}"
node_parts() { if (( $2 > 1 )); then seq -f "$1-%g" 1 "$2"; else echo "$1"; fi; }
# The second TaskManager and control plane are flink-tm-2 and control-plane-2 (flink.sh add-tm's
# names), the first keeps the single-node name.
replica_parts() { echo "$1"; if (( $2 > 1 )); then seq -f "$1-%g" 2 "$2"; fi; }
topology_parts() {
  node_parts kafka "$KAFKA_NODES"; node_parts cassandra "$CASSANDRA_NODES"
  echo flink-jm; replica_parts flink-tm "$FLINK_TASKMANAGERS"; replica_parts control-plane "$CONTROL_PLANES"
  echo postgres connect pushgateway prometheus | tr ' ' '\n'
}

# A killed server whose parent is gone can stay a zombie where nothing reaps orphans; a zombie is
# not alive (kill -0 alone would say it is).
pid_alive() {
  [ -n "${1:-}" ] && kill -0 "$1" 2>/dev/null && [ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" != "Z" ]
}

# running <part>: true when the pid we recorded for <part> is alive.
running() {
  local f="$RUN/$1/pid"
  [ -f "$f" ] && pid_alive "$(cat "$f")"
}

# extra_tms: the parts of TaskManagers `flink.sh add-tm` started (flink-tm-2, -3, ...), running or not.
extra_tms() { find "$RUN" -maxdepth 1 -name 'flink-tm-*' -printf '%f\n' | sort; }

# The timer slack of every server started here, in ns ("default": the kernel's 50 us). A timed
# wait may end up to this much late, so a thread polling for work in short naps (Cassandra's
# request workers nap 10 us at a time for ~10 ms after each request) wakes far less often; a
# thread that sleeps a fixed interval only wakes up to 1 ms later (what it saves Cassandra:
# docs/operating.md, deployment notes, timer slack).
# Set through /proc/self/timerslack_ns: every thread and child inherits it, exec keeps it.
TIMER_SLACK_NS="${WEBHOOKS_TIMER_SLACK_NS:-1000000}"

# start_bg <part> <log> <cmd...>: start a server in its own session, record its pid.
start_bg() {
  local part="$1" log="$2"; shift 2
  mkdir -p "$RUN/$part"
  (
    if [ "$TIMER_SLACK_NS" != default ]; then echo "$TIMER_SLACK_NS" 2>/dev/null > /proc/self/timerslack_ns || true; fi
    exec setsid "$@" >>"$log" 2>&1 < /dev/null
  ) &
  echo $! > "$RUN/$part/pid"
}

# explain_failure <part> <log> <why>: which part failed, why, the last lines of its log, where it is.
explain_failure() {
  local part="$1" log="$2" why="$3"
  printf '\033[31m[stack] %s failed: %s\033[0m\n' "$part" "$why" >&2
  if [ -f "$log" ]; then
    echo "---- last 25 lines of $log ----" >&2
    tail -n 25 "$log" >&2
    echo "---- full log: $log ----" >&2
  fi
  exit 1
}

# wait_until <part> <log> <timeout_s> <check-cmd...>: poll the check until it passes, the process
# dies, or the timeout ends.
wait_until() {
  local part="$1" log="$2" timeout="$3"; shift 3
  local start=$SECONDS
  until "$@" >/dev/null 2>&1; do
    if ! running "$part"; then explain_failure "$part" "$log" "process exited during start-up"; fi
    if (( SECONDS - start > timeout )); then explain_failure "$part" "$log" "not ready after ${timeout}s"; fi
    sleep 1
  done
}

# stop_part <part> [grace_s]: TERM the recorded pid's process group, then KILL after the grace.
stop_part() {
  local part="$1" grace="${2:-20}" f="$RUN/$1/pid"
  [ -f "$f" ] || return 0
  local pid; pid="$(cat "$f")"
  if pid_alive "$pid"; then
    say "stopping $part (pid $pid)"
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
    local i=0
    while pid_alive "$pid" && (( i < grace * 5 )); do sleep 0.2; i=$((i+1)); done
    if pid_alive "$pid"; then kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true; fi
  fi
  rm -f "$f"
}

# refuse_other_topology: one run directory runs one topology at a time (they use the same ports),
# so while a Kafka, Cassandra or control-plane part of another one runs, any script asked for a
# different TOPOLOGY fails at once and says what runs (a `make down TOPOLOGY=single` would leave
# the cluster running, a `make up` would collide with it). Checked below whenever the two differ.
refuse_other_topology() {
  local mine part
  mine=" $(topology_parts | tr '\n' ' ') "
  for part in kafka kafka-{1..9} cassandra cassandra-{1..9} control-plane control-plane-{2..9}; do
    case "$mine" in *" $part "*) continue ;; esac
    if running "$part"; then
      fail "the $TOPOLOGY_RECORDED topology runs in $RUN ($part, pid $(cat "$RUN/$part/pid")): 'make down' first, then 'make up TOPOLOGY=$TOPOLOGY'"
    fi
  done
}
if [ "$TOPOLOGY" != "$TOPOLOGY_RECORDED" ]; then refuse_other_topology; fi

# record_topology: up.sh, before starting anything, so later commands act on this topology.
record_topology() { echo "$TOPOLOGY" > "$RUN/topology"; }

# Tracing (docs/operating.md, tracing): TRACING=1 once (`make run TRACING=1`) turns it on for the
# control plane and the job (WEBHOOKS_TRACING__ENABLED=true) and adds Jaeger to the stack; up.sh
# records it in $RUN/tracing, so later commands (job, status, a restart) act alike, until
# TRACING=0. WEBHOOKS_TRACING__ENABLED in the environment also counts, for that command only.
case "${TRACING:-}" in
  ''|0|1) ;;
  *) fail "TRACING must be 1 (on) or 0 (off), not '${TRACING}'" ;;
esac
tracing_on() {
  case "${TRACING:-}" in 1) return 0 ;; 0) return 1 ;; esac
  case "${WEBHOOKS_TRACING__ENABLED:-}" in
    [Tt]rue|TRUE|1|[Yy]es|[Oo]n) return 0 ;;
    '') [ -f "$RUN/tracing" ] ;;
    *) return 1 ;;
  esac
}
# record_tracing: up.sh; TRACING=1 or 0 is remembered, no TRACING leaves the record as it is.
record_tracing() {
  case "${TRACING:-}" in 1) echo on > "$RUN/tracing" ;; 0) rm -f "$RUN/tracing" ;; esac
}
# tracing_apply: before starting a control plane or submitting a job, what it is started with.
tracing_apply() {
  if tracing_on; then export WEBHOOKS_TRACING__ENABLED=true; else export WEBHOOKS_TRACING__ENABLED=false; fi
}
