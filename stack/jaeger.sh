#!/usr/bin/env bash
# Build/start/stop Jaeger, the local stack's trace backend when tracing is on (docs/operating.md,
# tracing): the all-in-one v2 binary of the Go module github.com/jaegertracing/jaeger/cmd/jaeger,
# pinned as a Go tool in stack/jaeger/go.mod (with go.sum: nothing but the Go module proxy is
# read), built from source by `build` into stack/.tools/jaeger/ (git-ignored; once per version),
# run with stack/conf/jaeger.yaml: OTLP in (gRPC 4317, HTTP 4318), spans in memory, the UI and its
# query API on 16686, health on 13133, its own metrics on 8888 -- every listener on 127.0.0.1.
# `make up TRACING=1` starts it (up.sh), `make down` stops it, `make test` starts it if it is not
# running (tests/integration/test_tracing.py reads traces back from it) and stops it after.
source "$(dirname "$0")/lib.sh"
DIR="$RUN/jaeger"; LOG="$DIR/jaeger.log"
MOD="$REPO/stack/jaeger"
OUT="$REPO/stack/.tools/jaeger"; BIN="$OUT/jaeger"
UI_PORT="${WEBHOOKS_JAEGER_UI_PORT:-16686}"
QUERY_GRPC_PORT="${WEBHOOKS_JAEGER_QUERY_GRPC_PORT:-16685}"
OTLP_GRPC_PORT="${WEBHOOKS_JAEGER_OTLP_GRPC_PORT:-4317}"
OTLP_HTTP_PORT="${WEBHOOKS_JAEGER_OTLP_HTTP_PORT:-4318}"
HEALTH_PORT="${WEBHOOKS_JAEGER_HEALTH_PORT:-13133}"
METRICS_PORT="${WEBHOOKS_JAEGER_METRICS_PORT:-8888}"
# Traces kept in memory (the oldest go first); a soft cap on the Go heap beside it.
MAX_TRACES="${WEBHOOKS_JAEGER_MAX_TRACES:-50000}"
MEMORY_LIMIT="${WEBHOOKS_JAEGER_MEMORY_LIMIT:-768MiB}"

go_cmd() {
  if command -v go >/dev/null; then command -v go
  elif [ -x /usr/local/go/bin/go ]; then echo /usr/local/go/bin/go
  else fail "go not found: building Jaeger (tracing) needs Go >= 1.24 on PATH or in /usr/local/go"
  fi
}

build() {
  local stamp; stamp="$OUT/.built-$(cat "$MOD/go.mod" "$MOD/go.sum" | sha256sum | cut -c1-16)"
  if [ -x "$BIN" ] && [ -f "$stamp" ]; then return; fi
  local go; go="$(go_cmd)"
  mkdir -p "$OUT"
  rm -f "$OUT"/.built-*
  say "building Jaeger from source with $("$go" version | cut -d' ' -f3) (the first build takes minutes; log $OUT/build.log)"
  local t0=$SECONDS
  # -mod=readonly: exactly what go.mod and go.sum pin; -trimpath: no local paths in the binary.
  (cd "$MOD" && "$go" build -mod=readonly -trimpath -o "$BIN" github.com/jaegertracing/jaeger/cmd/jaeger) \
    > "$OUT/build.log" 2>&1 || explain_failure jaeger "$OUT/build.log" "go build failed"
  touch "$stamp"
  say "Jaeger built in $((SECONDS - t0))s: $BIN ($(du -h "$BIN" | cut -f1))"
}

start() {
  build
  if running jaeger; then say "jaeger already running (pid $(cat "$DIR/pid"))"; return; fi
  mkdir -p "$DIR"
  sed -e "s#__UI_PORT__#$UI_PORT#g" -e "s#__QUERY_GRPC_PORT__#$QUERY_GRPC_PORT#g" \
      -e "s#__OTLP_GRPC_PORT__#$OTLP_GRPC_PORT#g" -e "s#__OTLP_HTTP_PORT__#$OTLP_HTTP_PORT#g" \
      -e "s#__HEALTH_PORT__#$HEALTH_PORT#g" -e "s#__METRICS_PORT__#$METRICS_PORT#g" \
      -e "s#__MAX_TRACES__#$MAX_TRACES#g" "$REPO/stack/conf/jaeger.yaml" > "$DIR/jaeger.yaml"
  say "starting jaeger: OTLP/HTTP 127.0.0.1:$OTLP_HTTP_PORT, UI http://127.0.0.1:$UI_PORT"
  GOMEMLIMIT="$MEMORY_LIMIT" start_bg jaeger "$LOG" "$BIN" --config "file:$DIR/jaeger.yaml"
}

ready() {
  # The query API answers once storage, query and the receivers are up.
  wait_until jaeger "$LOG" 60 curl -sf "http://127.0.0.1:$UI_PORT/api/services"
  say "jaeger ready: UI http://127.0.0.1:$UI_PORT"
}

case "${1:-}" in
  build) build ;;
  start) start ;;
  ready) ready ;;
  stop) stop_part jaeger 10 ;;
  *) echo "usage: $0 build|start|ready|stop" >&2; exit 2 ;;
esac
