#!/usr/bin/env bash
# Start/stop a local standalone Flink cluster (one JobManager with the dashboard, one TaskManager,
# or WEBHOOKS_FLINK_TASKMANAGERS of them in the cluster topology) from the apache-flink wheel,
# configured from flink-conf/. `add-tm` starts one more TaskManager
# (part flink-tm-2, -3, ...; the benchmark's --taskmanagers uses it): thread-mode Python runs
# one interpreter per TaskManager, so more TaskManagers are how a job gets more Python.
source "$(dirname "$0")/lib.sh"
DIR="$RUN/flink"; CONF="$DIR/conf"
REST_PORT="${WEBHOOKS_FLINK_REST_PORT:-8081}"
RPC_PORT="${WEBHOOKS_FLINK_RPC_PORT:-6123}"; BLOB_PORTS="${WEBHOOKS_FLINK_BLOB_PORTS:-6124-6130}"
export FLINK_HOME="$("$PY" -c 'import os, pyflink; print(os.path.dirname(pyflink.__file__))')"
export FLINK_CONF_DIR="$CONF" FLINK_LOG_DIR="$DIR/log" FLINK_PID_DIR="$DIR"
SITE="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"

render_conf() {
  mkdir -p "$CONF" "$DIR/log" "$DIR/checkpoints" "$DIR/savepoints"
  cp "$FLINK_HOME"/conf/log4j*.properties "$CONF/"
  sed -e "s#__RUN__#$RUN#g" -e "s#__PY__#$PY#g" -e "s#__REST_PORT__#$REST_PORT#g" \
      -e "s#__PYTHONPATH__#$REPO:$SITE#g" -e "s#__PUSHGATEWAY_PORT__#${WEBHOOKS_PUSHGATEWAY_PORT:-9091}#g" \
      -e "s#__RPC_PORT__#$RPC_PORT#g" -e "s#__BLOB_PORTS__#$BLOB_PORTS#g" \
      -e "s#__SCHEDULER__#${WEBHOOKS_FLINK_SCHEDULER:-adaptive}#g" \
      "$REPO/flink-conf/config.yaml" > "$CONF/config.yaml"
  # WEBHOOKS_METRICS_REPORTER=off: no Prometheus reporter (the benchmark's "without" figure). The
  # metrics block is the last one of flink-conf/config.yaml.
  if [ "${WEBHOOKS_METRICS_REPORTER:-on}" = off ]; then sed -i '/^metrics:/,$d' "$CONF/config.yaml"; fi
}

# The connector jars and flink-python go into the wheel's lib/: thread mode needs flink-python on
# the parent classpath (see flink-conf), and lib/ is where a real cluster image puts connectors.
install_jars() {
  cp -n "$FLINK_HOME"/opt/flink-python-*.jar "$FLINK_HOME/lib/"
  cp -n "$JARS"/flink-connectors/*.jar "$FLINK_HOME/lib/"
}

start() {
  [ -d "$JARS/flink-connectors" ] || fail "flink connector jars missing: run 'make setup'"
  render_conf
  install_jars
  # Metrics groups of Flink processes that died without deleting theirs (best effort).
  "$PY" -m stack.pushgateway_gc 2>/dev/null || true
  if running flink-jm; then say "flink jobmanager already running (pid $(cat "$RUN/flink-jm/pid"))";
  else
    say "starting flink jobmanager (dashboard http://127.0.0.1:$REST_PORT)"
    start_bg flink-jm "$DIR/log/jobmanager.log" "$FLINK_HOME/bin/jobmanager.sh" start-foreground
  fi
  if running flink-tm; then say "flink taskmanager already running (pid $(cat "$RUN/flink-tm/pid"))";
  else
    say "starting flink taskmanager"
    start_bg flink-tm "$DIR/log/taskmanager.log" "$FLINK_HOME/bin/taskmanager.sh" start-foreground
  fi
  # The topology's other TaskManagers (WEBHOOKS_FLINK_TASKMANAGERS): flink-tm-2, ...
  local part
  for part in $(replica_parts flink-tm "$FLINK_TASKMANAGERS" | tail -n +2); do
    if running "$part"; then say "flink $part already running (pid $(cat "$RUN/$part/pid"))"; continue; fi
    say "starting flink taskmanager $part"
    start_bg "$part" "$DIR/log/$part.log" "$FLINK_HOME/bin/taskmanager.sh" start-foreground
  done
}

# tm_registered [n]: at least n (default 1) TaskManagers registered with the JobManager.
tm_registered() {
  "$PY" - "$REST_PORT" "${1:-1}" <<'PY'
import json, sys, urllib.request
o = json.load(urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/overview", timeout=2))
sys.exit(0 if o["taskmanagers"] >= int(sys.argv[2]) else 1)
PY
}

add_tm() {
  running flink-jm || fail "flink is not running: start the stack first (make up)"
  local k=2
  while running "flink-tm-$k"; do k=$((k+1)); done
  local part="flink-tm-$k" n=2 p
  for p in $(extra_tms); do if running "$p"; then n=$((n+1)); fi; done
  say "starting flink taskmanager $part"
  start_bg "$part" "$DIR/log/$part.log" "$FLINK_HOME/bin/taskmanager.sh" start-foreground
  wait_until "$part" "$DIR/log/$part.log" 120 tm_registered "$n"
  echo "$part"
}

ready() {
  wait_until flink-jm "$DIR/log/jobmanager.log" 120 tm_registered "$FLINK_TASKMANAGERS"
  running flink-tm || explain_failure flink-tm "$DIR/log/taskmanager.log" "process exited during start-up"
  say "flink ready: dashboard http://127.0.0.1:$REST_PORT"
}

case "${1:-}" in
  start) start ;;
  ready) ready ;;
  add-tm) render_conf; add_tm ;;
  stop-tm) stop_part "${2:?usage: $0 stop-tm <part>}" 30 ;;
  stop)
    for part in $(extra_tms); do stop_part "$part" 30; done
    stop_part flink-tm 30; stop_part flink-jm 30 ;;
  env) echo "export FLINK_HOME=$FLINK_HOME FLINK_CONF_DIR=$FLINK_CONF_DIR FLINK_LOG_DIR=$FLINK_LOG_DIR" ;;
  *) echo "usage: $0 start|ready|add-tm|stop-tm <part>|stop|env" >&2; exit 2 ;;
esac
