#!/usr/bin/env bash
# Start/stop the local Kafka (KRaft single node) from the jars Maven resolved into stack/.jars/kafka.
source "$(dirname "$0")/lib.sh"
PORT="${WEBHOOKS_KAFKA_PORT:-9092}"
CONTROLLER_PORT="${WEBHOOKS_KAFKA_CONTROLLER_PORT:-9093}"
DIR="$RUN/kafka"; LOG="$DIR/kafka.log"; CONF="$DIR/server.properties"
CP="$JARS/kafka/*"
JAVA_OPTS=(-Xms256m -Xmx512m -XX:+UseG1GC -Djava.awt.headless=true -Djava.io.tmpdir="$RUN/tmp"
           -Dlog4j2.configurationFile="$REPO/stack/conf/kafka-log4j2.yaml" -Dkafka.logs.dir="$DIR")

start() {
  [ -d "$JARS/kafka" ] || fail "kafka jars missing: run 'make setup'"
  if running kafka; then say "kafka already running (pid $(cat "$DIR/pid"))"; return; fi
  mkdir -p "$DIR/data"
  sed -e "s#__RUN__#$RUN#g" -e "s#__PORT__#$PORT#g" -e "s#__CONTROLLER_PORT__#$CONTROLLER_PORT#g" \
      "$REPO/stack/conf/kafka.properties" > "$CONF"
  if [ ! -f "$DIR/data/meta.properties" ]; then
    say "formatting kafka storage"
    # "--cluster-id=ID", not "-t ID": one id in 64 starts with "-" and was taken for an option.
    java "${JAVA_OPTS[@]}" -cp "$CP" kafka.tools.StorageTool format --standalone \
      --cluster-id="$("$PY" -c "import base64,uuid;print(base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip('='))")" \
      -c "$CONF" >>"$LOG" 2>&1 \
      || explain_failure kafka "$LOG" "storage format failed"
  fi
  say "starting kafka on 127.0.0.1:$PORT"
  start_bg kafka "$LOG" java "${JAVA_OPTS[@]}" -cp "$CP" kafka.Kafka "$CONF"
}

ready() {
  wait_until kafka "$LOG" 120 "$PY" -m stack.topics --check --bootstrap "127.0.0.1:$PORT"
  say "kafka ready"
}

case "${1:-}" in
  start) start ;;
  ready) ready ;;
  stop) stop_part kafka 30 ;;
  *) echo "usage: $0 start|ready|stop" >&2; exit 2 ;;
esac
