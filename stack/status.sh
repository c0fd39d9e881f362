#!/usr/bin/env bash
# Where everything is.
source "$(dirname "$0")/lib.sh"
show() {
  if running "$1"; then state="running (pid $(cat "$RUN/$1/pid"))"; else state="stopped"; fi
  printf '  %-16s %s\n' "$1" "$state"
}
printf '  %-16s %s\n' topology "$TOPOLOGY"
parts="$(topology_parts)"
last_tm="$(replica_parts flink-tm "$FLINK_TASKMANAGERS" | tail -n 1)"
for part in $parts; do
  show "$part"
  if [ "$part" = "$last_tm" ]; then
    for d in $(extra_tms); do  # TaskManagers added by `flink.sh add-tm`, listed while they run
      if running "$d" && ! grep -qx "$d" <<< "$parts"; then show "$d"; fi
    done
  fi
done
show archive-writer  # started by make run, not make up (stack/archive.sh)
show archive-audit
if tracing_on || running jaeger; then show jaeger; fi  # the trace backend (TRACING=1: stack/jaeger.sh)
if running control-plane && [ -f "$RUN/control-plane/local-receivers" ]; then  # stack/local_receivers.sh
  printf '  \033[33m%-14s %s\033[0m\n' "egress" "LOCAL_RECEIVERS on: 127.0.0.1 reachable despite the SSRF policy (development only)"
fi
traces=""
if tracing_on || running jaeger; then
  traces=$'\n'"  Traces           http://127.0.0.1:${WEBHOOKS_JAEGER_UI_PORT:-16686}   (Jaeger UI; tracing $(tracing_on && echo on || echo off); spans by OTLP/HTTP to ${WEBHOOKS_TRACING__OTLP_ENDPOINT:-http://127.0.0.1:4318})"
fi
cat <<TXT
  Flink dashboard  http://127.0.0.1:${WEBHOOKS_FLINK_REST_PORT:-8081}
  gRPC API         127.0.0.1:${WEBHOOKS_CONTROL_PLANE__PORT:-50051}$( ((CONTROL_PLANES > 1)) && echo " to $((${WEBHOOKS_CONTROL_PLANE__PORT:-50051} + CONTROL_PLANES - 1)), one per replica")   (webhookctl --help; grpcurl -plaintext 127.0.0.1:50051 list)
  HTTP API         http://127.0.0.1:${WEBHOOKS_CONTROL_PLANE__HTTP_PORT:-8088}/v1   (OpenAPI 3.1: /v1/openapi.json; Authorization: Bearer <api key>)
  Console          http://127.0.0.1:${WEBHOOKS_CONTROL_PLANE__CONSOLE_PORT:-8090}   (web console: log in with a tenant API key or the admin token; webhookctl portal link)
  Kafka            ${WEBHOOKS_KAFKA__BOOTSTRAP_SERVERS:-127.0.0.1:${WEBHOOKS_KAFKA_PORT:-9092}}   topics webhooks.events, webhooks.endpoints, webhooks.replays, webhooks.events.dlq
  Cassandra        $(seq -f "127.0.0.%g" 1 "$CASSANDRA_NODES" | paste -sd,):${WEBHOOKS_CASSANDRA_PORT:-9042}   keyspace webhooks
  PostgreSQL       127.0.0.1:${WEBHOOKS_POSTGRES_PORT:-55432}   database webhooks, table webhook_outbox (webhookctl events publish)
  Kafka Connect    http://127.0.0.1:${WEBHOOKS_OUTBOX__CONNECT_REST_PORT:-8083}/connectors/webhooks-outbox/status   (Debezium: outbox -> webhooks.events)
  Prometheus       http://127.0.0.1:${WEBHOOKS_PROMETHEUS_PORT:-9090}   (alerts /alerts, rules /rules; webhookctl stats)${traces}
  Metrics          Flink -> Pushgateway http://127.0.0.1:${WEBHOOKS_PUSHGATEWAY_PORT:-9091}; control plane http://127.0.0.1:${WEBHOOKS_CONTROL_PLANE__METRICS_PORT:-9464}/metrics
  Logs             $RUN/*/  (kafka/kafka.log, cassandra/cassandra.log, flink/log/, control-plane/control-plane.log,
                   postgres/postgres.log, connect/connect.log)
  Stop             make down
TXT
