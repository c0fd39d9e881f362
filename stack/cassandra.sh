#!/usr/bin/env bash
# Start/stop the local Cassandra from the jars Maven resolved into stack/.jars/cassandra: a single
# node (part cassandra), or in the cluster topology a ring of WEBHOOKS_CASSANDRA_NODES (parts
# cassandra-1..N), node n on 127.0.0.n with the same ports and its JMX on JMX_PORT + 100 (n-1).
source "$(dirname "$0")/lib.sh"
NATIVE_PORT="${WEBHOOKS_CASSANDRA_PORT:-9042}"
STORAGE_PORT="${WEBHOOKS_CASSANDRA_STORAGE_PORT:-7000}"
JMX_PORT="${WEBHOOKS_CASSANDRA_JMX_PORT:-7199}"
HEAP="${WEBHOOKS_CASSANDRA_HEAP:-1G}"

# JDK 17 needs these module openings (from Cassandra's conf/jvm17-server.options).
JPMS=(
  -Djdk.attach.allowAttachSelf=true
  --add-exports java.base/jdk.internal.misc=ALL-UNNAMED
  --add-exports java.management.rmi/com.sun.jmx.remote.internal.rmi=ALL-UNNAMED
  --add-exports java.rmi/sun.rmi.registry=ALL-UNNAMED
  --add-exports java.rmi/sun.rmi.server=ALL-UNNAMED
  --add-exports java.sql/java.sql=ALL-UNNAMED
  --add-exports java.base/java.lang.ref=ALL-UNNAMED
  --add-exports jdk.unsupported/sun.misc=ALL-UNNAMED
  --add-exports jdk.compiler/com.sun.tools.javac.file=ALL-UNNAMED
  --add-exports jdk.attach/sun.tools.attach=ALL-UNNAMED
  --add-opens java.base/java.lang.module=ALL-UNNAMED
  --add-opens java.base/jdk.internal.loader=ALL-UNNAMED
  --add-opens java.base/jdk.internal.ref=ALL-UNNAMED
  --add-opens java.base/jdk.internal.reflect=ALL-UNNAMED
  --add-opens java.base/jdk.internal.math=ALL-UNNAMED
  --add-opens java.base/jdk.internal.module=ALL-UNNAMED
  --add-opens java.base/jdk.internal.util.jar=ALL-UNNAMED
  --add-opens jdk.management/com.sun.management.internal=ALL-UNNAMED
  --add-opens java.base/sun.nio.ch=ALL-UNNAMED
  --add-opens java.base/java.io=ALL-UNNAMED
  --add-opens java.base/java.lang.reflect=ALL-UNNAMED
  --add-opens jdk.compiler/com.sun.tools.javac=ALL-UNNAMED
  --add-opens java.base/java.lang=ALL-UNNAMED
  --add-opens java.base/java.util=ALL-UNNAMED
  --add-opens java.base/java.nio=ALL-UNNAMED
  --add-opens java.base/java.util.concurrent=ALL-UNNAMED
  --add-opens java.base/java.util.concurrent.atomic=ALL-UNNAMED
)

java_opts() {  # java_opts <dir> <conf> <jmx port>: sets JAVA_OPTS for one node
  JAVA_OPTS=(
    -Xms"$HEAP" -Xmx"$HEAP" -XX:+UseG1GC -XX:MaxGCPauseMillis=300 -Xss512k
    -XX:MaxDirectMemorySize=512m
    -Dio.netty.tryReflectionSetAccessible=true
    -Dcassandra.config="file://$2"
    -Dcassandra.storagedir="$1"
    -Dcassandra.logdir="$1"
    -Dlogback.configurationFile="$REPO/stack/conf/cassandra-logback.xml"
    -Dcassandra.skip_wait_for_gossip_to_settle=0
    -Dcassandra.ring_delay_ms=0
    # The approximate clock (request expiry, queue times) ticks on a scheduled task every 2 ms by
    # default: 500 wake-ups a second on an idle node. Timeouts here are seconds; 10 ms is plenty.
    -Dcassandra.approximate_time_precision_ms=10
    -Dcassandra.jmx.local.port="$3"
    -Djava.rmi.server.hostname=127.0.0.1
    -Djava.io.tmpdir="$RUN/tmp"
    -Dcassandra-foreground=yes
  )
}

# start_node <part> <address> <jmx port> <sed expressions...>: render the node's yaml, start it.
start_node() {
  local part="$1" address="$2" jmx="$3"; shift 3
  local dir="$RUN/$part"; local log="$dir/cassandra.log" conf="$dir/cassandra.yaml" template
  if running "$part"; then say "$part already running (pid $(cat "$dir/pid"))"; return; fi
  mkdir -p "$dir"/{data,commitlog,saved_caches,hints,cdc_raw}
  template="$REPO/stack/conf/cassandra.yaml"
  if (( CASSANDRA_NODES > 1 )); then template="$REPO/stack/conf/cassandra-cluster.yaml"; fi
  sed -e "s#__RUN__#$RUN#g" -e "s#__DIR__#$dir#g" -e "s#__NATIVE_PORT__#$NATIVE_PORT#g" \
      -e "s#__STORAGE_PORT__#$STORAGE_PORT#g" -e "s#__ADDRESS__#$address#g" "$@" "$template" > "$conf"
  java_opts "$dir" "$conf" "$jmx"
  say "starting $part on $address:$NATIVE_PORT (heap $HEAP)"
  start_bg "$part" "$log" java "${JPMS[@]}" "${JAVA_OPTS[@]}" -cp "$JARS/cassandra/*" \
    org.apache.cassandra.service.CassandraDaemon
}

start() {
  [ -d "$JARS/cassandra" ] || fail "cassandra jars missing: run 'make setup'"
  if (( CASSANDRA_NODES == 1 )); then start_node cassandra 127.0.0.1 "$JMX_PORT"; return; fi
  # Every node a seed of the others, each with one evenly spaced token (cassandra-cluster.yaml).
  local n seeds tokens
  seeds="$(seq -f "127.0.0.%g:$STORAGE_PORT" 1 "$CASSANDRA_NODES" | paste -sd,)"
  read -r -a tokens <<< "$("$PY" -c "import sys; n=int(sys.argv[1]); print(*(-2**63 + i * 2**64 // n for i in range(n)))" "$CASSANDRA_NODES")"
  for n in $(seq 1 "$CASSANDRA_NODES"); do
    start_node "cassandra-$n" "127.0.0.$n" "$((JMX_PORT + 100 * (n - 1)))" \
      -e "s#__SEEDS__#$seeds#g" -e "s#__TOKEN__#${tokens[$((n - 1))]}#g"
  done
}

ready() {
  # Every node up in the driver's view: an RF 3 keyspace needs the whole ring for its schema, and
  # LOCAL_QUORUM writes need two of three replicas.
  local part
  for part in $(node_parts cassandra "$CASSANDRA_NODES"); do
    wait_until "$part" "$RUN/$part/cassandra.log" 240 "$PY" -m stack.cassandra_schema --check --nodes "$CASSANDRA_NODES"
  done
  say "cassandra ready ($CASSANDRA_NODES node(s))"
}

stop() {
  local part
  # All nodes at once: each takes its own grace to shut down cleanly, not one after the other.
  for part in $(node_parts cassandra "$CASSANDRA_NODES"); do stop_part "$part" 40 & done
  wait
}

case "${1:-}" in
  start) start ;;
  ready) ready ;;
  stop) stop ;;
  *) echo "usage: $0 start|ready|stop" >&2; exit 2 ;;
esac
