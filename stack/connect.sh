#!/usr/bin/env bash
# Start/stop the Kafka Connect worker (standalone, from the Kafka release's connect-runtime) running
# the Debezium PostgreSQL connector on the outbox table: PostgreSQL WAL -> webhooks.events.
# Jars: stack/maven/connect.xml, resolved by `make setup` into stack/.jars/connect.
source "$(dirname "$0")/lib.sh"
DIR="$RUN/connect"; LOG="$DIR/connect.log"
JAVA_OPTS=(-Xms128m -Xmx512m -XX:+UseG1GC -Djava.awt.headless=true -Djava.io.tmpdir="$RUN/tmp"
           -Dlog4j2.configurationFile="$REPO/stack/conf/connect-log4j2.properties")

start() {
  [ -f "$JARS/connect/.complete" ] || fail "connect jars missing: run 'make setup'"
  if running connect; then say "connect already running (pid $(cat "$DIR/pid"))"; return; fi
  mkdir -p "$DIR"
  (cd "$REPO" && "$PY" -m stack.connect_config render "$DIR") || fail "could not render the connect config"
  say "starting kafka connect (debezium outbox connector), REST on 127.0.0.1:${WEBHOOKS_OUTBOX__CONNECT_REST_PORT:-8083}"
  start_bg connect "$LOG" java "${JAVA_OPTS[@]}" -cp "$JARS/connect/*" \
    org.apache.kafka.connect.cli.ConnectStandalone "$DIR/worker.properties" "$DIR/outbox-connector.properties"
}

check() {
  local rc=0
  (cd "$REPO" && "$PY" -m stack.connect_config check 2>>"$DIR/check.err") || rc=$?
  if [ "$rc" = 2 ]; then explain_failure connect "$DIR/check.err" "the outbox connector's task failed"; fi
  return "$rc"
}

ready() {
  wait_until connect "$LOG" 120 check
  say "connect ready: outbox connector streaming"
}

case "${1:-}" in
  start) start ;;
  ready) ready ;;
  stop) stop_part connect 20 ;;
  kill) # fault tests: SIGKILL, no offset flush, no clean shutdown
    if running connect; then kill -KILL "$(cat "$DIR/pid")"; rm -f "$DIR/pid"; fi ;;
  *) echo "usage: $0 start|ready|stop|kill" >&2; exit 2 ;;
esac
