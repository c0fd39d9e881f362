#!/usr/bin/env bash
# Start/stop the gRPC control plane (health + reflection on) on 127.0.0.1: one, or in the cluster
# topology WEBHOOKS_CONTROL_PLANE_REPLICAS of them (parts control-plane, control-plane-2, ...),
# replica n on the gRPC, metrics, console and HTTP API ports + (n-1) (stack/topologies/cluster.env).
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/local_receivers.sh"
PORT="${WEBHOOKS_CONTROL_PLANE__PORT:-50051}"
METRICS_PORT="${WEBHOOKS_CONTROL_PLANE__METRICS_PORT:-9464}"
CONSOLE_PORT="${WEBHOOKS_CONTROL_PLANE__CONSOLE_PORT:-8090}"
HTTP_PORT="${WEBHOOKS_CONTROL_PLANE__HTTP_PORT:-8088}"

replica() { case "$1" in control-plane) echo 1 ;; *) echo "${1##*-}" ;; esac; }
shifted() { if (( $1 == 0 )); then echo 0; else echo $(( $1 + $2 - 1 )); fi; }  # 0 stays off

start_one() {
  local part="$1" n; n="$(replica "$1")"; local dir="$RUN/$part"
  if running "$part"; then
    say "$part already running (pid $(cat "$dir/pid"))"; local_receivers_check "$part" "$dir"; return
  fi
  mkdir -p "$dir"
  local_receivers_apply "$part" "$dir"
  tracing_apply
  say "starting $part on 127.0.0.1:$((PORT + n - 1))"
  WEBHOOKS_CONTROL_PLANE__PORT=$((PORT + n - 1)) \
  WEBHOOKS_CONTROL_PLANE__METRICS_PORT="$(shifted "$METRICS_PORT" "$n")" \
  WEBHOOKS_CONTROL_PLANE__CONSOLE_PORT="$(shifted "$CONSOLE_PORT" "$n")" \
  WEBHOOKS_CONTROL_PLANE__HTTP_PORT="$(shifted "$HTTP_PORT" "$n")" \
    start_bg "$part" "$dir/control-plane.log" "$PY" -m control_plane.server
}

healthy() {
  "$PY" - "$1" <<'PY'
import sys, grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
ch = grpc.insecure_channel(f"127.0.0.1:{sys.argv[1]}")
r = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=""), timeout=2)
sys.exit(0 if r.status == health_pb2.HealthCheckResponse.SERVING else 1)
PY
}

ready() {
  local part n
  for part in $(replica_parts control-plane "$CONTROL_PLANES"); do
    n="$(replica "$part")"
    wait_until "$part" "$RUN/$part/control-plane.log" 60 healthy $((PORT + n - 1))
    say "$part ready: 127.0.0.1:$((PORT + n - 1))"
  done
}

case "${1:-}" in
  start) for part in $(replica_parts control-plane "$CONTROL_PLANES"); do start_one "$part"; done ;;
  ready) ready ;;
  stop) for part in $(replica_parts control-plane "$CONTROL_PLANES"); do stop_part "$part" 10; done ;;
  *) echo "usage: $0 start|ready|stop" >&2; exit 2 ;;
esac
