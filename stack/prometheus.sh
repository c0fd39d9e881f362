#!/usr/bin/env bash
# Start/stop the metrics side of the local stack, both Debian packages on 127.0.0.1:
# - the Prometheus Pushgateway (9091): Flink's reporter pushes every JobManager's and
#   TaskManager's metrics there (flink-conf: metrics.reporter.prom), because Flink's pull reporter
#   can only listen on every interface;
# - Prometheus (9090): scrapes the Pushgateway and the control plane (its /metrics on 9464),
#   evaluates the recording and alert rules of stack/conf/prometheus-rules.yml, and serves the
#   delivery health page stack/consoles/webhooks.html at /consoles/webhooks.html.
source "$(dirname "$0")/lib.sh"
PROM_PORT="${WEBHOOKS_PROMETHEUS_PORT:-9090}"
PGW_PORT="${WEBHOOKS_PUSHGATEWAY_PORT:-9091}"
CP_METRICS_PORT="${WEBHOOKS_CONTROL_PLANE__METRICS_PORT:-9464}"
DIR="$RUN/prometheus"; LOG="$DIR/prometheus.log"
PGW_DIR="$RUN/pushgateway"; PGW_LOG="$PGW_DIR/pushgateway.log"

need() { command -v "$1" >/dev/null || fail "$1 not found: run 'make setup' (apt-get install prometheus prometheus-pushgateway)"; }

start() {
  need prometheus; need prometheus-pushgateway
  mkdir -p "$DIR/data" "$PGW_DIR"
  if running pushgateway; then say "pushgateway already running (pid $(cat "$PGW_DIR/pid"))"; else
    say "starting prometheus pushgateway on 127.0.0.1:$PGW_PORT"
    # Its groups persist in this stack's run directory: Debian's default file is the system's
    # /var/lib/prometheus/pushgateway.data, shared by every stack on the machine (a CI clone
    # started with every group an earlier run had pushed, 2.3 MB of them).
    start_bg pushgateway "$PGW_LOG" prometheus-pushgateway --web.listen-address="127.0.0.1:$PGW_PORT" \
      --persistence.file="$PGW_DIR/pushgateway.data"
  fi
  if running prometheus; then say "prometheus already running (pid $(cat "$DIR/pid"))"; return; fi
  # Every control-plane replica's /metrics (the cluster topology runs two, on consecutive ports).
  local cp_targets; cp_targets="$(seq -f "127.0.0.1:%g" "$CP_METRICS_PORT" "$((CP_METRICS_PORT + CONTROL_PLANES - 1))" | paste -sd' ' | sed 's/ /", "/g')"
  sed -e "s#__PGW__#127.0.0.1:$PGW_PORT#g" -e "s#__CP__#$cp_targets#g" \
      -e "s#__RULES__#$REPO/stack/conf/prometheus-rules.yml#g" "$REPO/stack/conf/prometheus.yml" > "$DIR/prometheus.yml"
  say "starting prometheus on 127.0.0.1:$PROM_PORT"
  start_bg prometheus "$LOG" prometheus --config.file="$DIR/prometheus.yml" --storage.tsdb.path="$DIR/data" \
    --storage.tsdb.retention.time=7d --web.listen-address="127.0.0.1:$PROM_PORT" --web.enable-lifecycle \
    --web.console.templates="$REPO/stack/consoles" --web.console.libraries="$REPO/stack/consoles"
}

ready() {
  wait_until pushgateway "$PGW_LOG" 60 curl -sf "http://127.0.0.1:$PGW_PORT/-/ready"
  wait_until prometheus "$LOG" 60 curl -sf "http://127.0.0.1:$PROM_PORT/-/ready"
  say "prometheus ready: http://127.0.0.1:$PROM_PORT (alerts: /alerts)"
}

case "${1:-}" in
  start) start ;;
  ready) ready ;;
  stop) stop_part prometheus 20; stop_part pushgateway 10 ;;
  *) echo "usage: $0 start|ready|stop" >&2; exit 2 ;;
esac
