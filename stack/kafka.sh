#!/usr/bin/env bash
# Start/stop the local Kafka from the jars Maven resolved into stack/.jars/kafka: one KRaft node
# (part kafka), or in the cluster topology WEBHOOKS_KAFKA_NODES of them (parts kafka-1..N), each
# broker and controller, node n on ports PORT + 100 (n-1) (stack/topologies/cluster.env).
source "$(dirname "$0")/lib.sh"
PORT="${WEBHOOKS_KAFKA_PORT:-9092}"
CONTROLLER_PORT="${WEBHOOKS_KAFKA_CONTROLLER_PORT:-9093}"
CP="$JARS/kafka/*"

java_opts() {  # java_opts <dir>: sets JAVA_OPTS for the node whose logs go to <dir>
  JAVA_OPTS=(-Xms256m -Xmx"${WEBHOOKS_KAFKA_HEAP:-512m}" -XX:+UseG1GC -Djava.awt.headless=true
             -Djava.io.tmpdir="$RUN/tmp" -Dlog4j2.configurationFile="$REPO/stack/conf/kafka-log4j2.yaml"
             -Dkafka.logs.dir="$1")
}

new_cluster_id() {
  # "--cluster-id=ID", not "-t ID": one id in 64 starts with "-" and was taken for an option.
  "$PY" -c "import base64,uuid;print(base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip('='))"
}

# start_node <part> <properties template> <port> <controller port> <storage format args...>
# (format args: used once, on a node whose storage is not formatted yet)
start_node() {
  local part="$1" template="$2" port="$3" cport="$4"; shift 4
  local dir="$RUN/$part"; local log="$dir/kafka.log" conf="$dir/server.properties"
  if running "$part"; then say "$part already running (pid $(cat "$dir/pid"))"; return; fi
  mkdir -p "$dir/data"
  sed -e "s#__RUN__#$RUN#g" -e "s#__DIR__#$dir#g" -e "s#__PORT__#$port#g" -e "s#__CONTROLLER_PORT__#$cport#g" \
      -e "s#__NODE_ID__#${part##*-}#g" -e "s#__VOTERS__#${VOTERS:-}#g" "$template" > "$conf"
  java_opts "$dir"
  if [ ! -f "$dir/data/meta.properties" ]; then
    say "formatting $part storage"
    java "${JAVA_OPTS[@]}" -cp "$CP" kafka.tools.StorageTool format "$@" -c "$conf" >>"$log" 2>&1 \
      || explain_failure "$part" "$log" "storage format failed"
  fi
  say "starting $part on 127.0.0.1:$port"
  start_bg "$part" "$log" java "${JAVA_OPTS[@]}" -cp "$CP" kafka.Kafka "$conf"
}

node_port() { echo $(( $1 + 100 * ($2 - 1) )); }  # node_port <base> <n>

start() {
  [ -d "$JARS/kafka" ] || fail "kafka jars missing: run 'make setup'"
  if (( KAFKA_NODES == 1 )); then
    start_node kafka "$REPO/stack/conf/kafka.properties" "$PORT" "$CONTROLLER_PORT" \
      --standalone --cluster-id="$(new_cluster_id)"
    return
  fi
  # Every node formatted with one cluster id, kept for nodes formatted later (a wiped node).
  local id_file="$RUN/kafka-cluster-id" n
  [ -f "$id_file" ] || new_cluster_id > "$id_file"
  VOTERS=""
  for n in $(seq 1 "$KAFKA_NODES"); do
    VOTERS="${VOTERS:+$VOTERS,}$n@127.0.0.1:$(node_port "$CONTROLLER_PORT" "$n")"
  done
  for n in $(seq 1 "$KAFKA_NODES"); do
    start_node "kafka-$n" "$REPO/stack/conf/kafka-cluster.properties" "$(node_port "$PORT" "$n")" \
      "$(node_port "$CONTROLLER_PORT" "$n")" --cluster-id="$(cat "$id_file")"
  done
}

ready() {
  local part bootstrap="127.0.0.1:$PORT"
  if (( KAFKA_NODES > 1 )); then bootstrap="${WEBHOOKS_KAFKA__BOOTSTRAP_SERVERS:?the cluster topology sets it}"; fi
  # Every node must be up and registered: topics at RF 3 cannot be created with fewer brokers.
  for part in $(node_parts kafka "$KAFKA_NODES"); do
    wait_until "$part" "$RUN/$part/kafka.log" 120 "$PY" -m stack.topics --check --bootstrap "$bootstrap" \
      --brokers "$KAFKA_NODES"
  done
  say "kafka ready ($KAFKA_NODES node(s))"
}

stop() {
  local part
  # All at once: a broker's controlled shutdown needs the controller quorum, and each node stops
  # its broker before its controller. One after the other, the last node was alone, waited for a
  # quorum that had gone and was killed at the end of its grace (36 s for 3 nodes; at once: 7 s).
  for part in $(node_parts kafka "$KAFKA_NODES"); do stop_part "$part" 30 & done
  wait
}

case "${1:-}" in
  start) start ;;
  ready) ready ;;
  stop) stop ;;
  *) echo "usage: $0 start|ready|stop" >&2; exit 2 ;;
esac
