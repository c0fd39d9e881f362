#!/usr/bin/env bash
# Start/stop a single local Cassandra node from the jars Maven resolved into stack/.jars/cassandra.
source "$(dirname "$0")/lib.sh"
NATIVE_PORT="${WEBHOOKS_CASSANDRA_PORT:-9042}"
STORAGE_PORT="${WEBHOOKS_CASSANDRA_STORAGE_PORT:-7000}"
DIR="$RUN/cassandra"; LOG="$DIR/cassandra.log"; CONF="$DIR/cassandra.yaml"
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
JAVA_OPTS=(
  -Xms"$HEAP" -Xmx"$HEAP" -XX:+UseG1GC -XX:MaxGCPauseMillis=300 -Xss512k
  -XX:MaxDirectMemorySize=512m
  -Dio.netty.tryReflectionSetAccessible=true
  -Dcassandra.config="file://$CONF"
  -Dcassandra.storagedir="$DIR"
  -Dcassandra.logdir="$DIR"
  -Dlogback.configurationFile="$REPO/stack/conf/cassandra-logback.xml"
  -Dcassandra.skip_wait_for_gossip_to_settle=0
  -Dcassandra.ring_delay_ms=0
  -Dcassandra.jmx.local.port="${WEBHOOKS_CASSANDRA_JMX_PORT:-7199}"
  -Djava.rmi.server.hostname=127.0.0.1
  -Djava.io.tmpdir="$RUN/tmp"
  -Dcassandra-foreground=yes
)

start() {
  [ -d "$JARS/cassandra" ] || fail "cassandra jars missing: run 'make setup'"
  if running cassandra; then say "cassandra already running (pid $(cat "$DIR/pid"))"; return; fi
  mkdir -p "$DIR"/{data,commitlog,saved_caches,hints,cdc_raw}
  sed -e "s#__RUN__#$RUN#g" -e "s#__NATIVE_PORT__#$NATIVE_PORT#g" -e "s#__STORAGE_PORT__#$STORAGE_PORT#g" \
      "$REPO/stack/conf/cassandra.yaml" > "$CONF"
  say "starting cassandra on 127.0.0.1:$NATIVE_PORT (heap $HEAP)"
  start_bg cassandra "$LOG" java "${JPMS[@]}" "${JAVA_OPTS[@]}" -cp "$JARS/cassandra/*" \
    org.apache.cassandra.service.CassandraDaemon
}

ready() {
  wait_until cassandra "$LOG" 240 "$PY" -m stack.cassandra_schema --check
  say "cassandra ready"
}

case "${1:-}" in
  start) start ;;
  ready) ready ;;
  stop) stop_part cassandra 40 ;;
  *) echo "usage: $0 start|ready|stop" >&2; exit 2 ;;
esac
