#!/usr/bin/env bash
# Start/stop the gRPC control plane (health + reflection on) on 127.0.0.1.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/local_receivers.sh"
DIR="$RUN/control-plane"; LOG="$DIR/control-plane.log"
PORT="${WEBHOOKS_CONTROL_PLANE__PORT:-50051}"

start() {
  if running control-plane; then
    say "control plane already running (pid $(cat "$DIR/pid"))"; local_receivers_check "control plane" "$DIR"; return
  fi
  mkdir -p "$DIR"
  local_receivers_apply "control plane" "$DIR"
  say "starting control plane on 127.0.0.1:$PORT"
  start_bg control-plane "$LOG" "$PY" -m control_plane.server
}

healthy() {
  "$PY" - "$PORT" <<'PY'
import sys, grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
ch = grpc.insecure_channel(f"127.0.0.1:{sys.argv[1]}")
r = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=""), timeout=2)
sys.exit(0 if r.status == health_pb2.HealthCheckResponse.SERVING else 1)
PY
}

case "${1:-}" in
  start) start ;;
  ready) wait_until control-plane "$LOG" 60 healthy; say "control plane ready: 127.0.0.1:$PORT" ;;
  stop) stop_part control-plane 10 ;;
  *) echo "usage: $0 start|ready|stop" >&2; exit 2 ;;
esac
