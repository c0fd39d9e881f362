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

# start_bg <part> <log> <cmd...>: start a server in its own session, record its pid.
start_bg() {
  local part="$1" log="$2"; shift 2
  mkdir -p "$RUN/$part"
  setsid "$@" >>"$log" 2>&1 < /dev/null &
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
