#!/usr/bin/env bash
# Start/stop an S3-compatible server on 127.0.0.1 for the archive tier's S3 path: S3Proxy
# (Apache-2.0, Maven Central org.gaul:s3proxy, resolved by stack/setup.sh from stack/maven/s3proxy.xml)
# over jclouds' filesystem provider, so objects are plain files under .run/s3proxy/data/<bucket>/.
# `make up` does not start it (the archive's default is a local directory); the archive's
# integration tests start one of their own with this script (WEBHOOKS_RUN_DIR, WEBHOOKS_S3PROXY_PORT),
# and a developer trying the S3 path runs `stack/s3proxy.sh start && stack/s3proxy.sh ready` and sets
# WEBHOOKS_ARCHIVE__URI=s3://archive WEBHOOKS_ARCHIVE__S3_ENDPOINT=127.0.0.1:8334
# WEBHOOKS_ARCHIVE__S3_SCHEME=http WEBHOOKS_ARCHIVE__S3_ACCESS_KEY=local-identity
# WEBHOOKS_ARCHIVE__S3_SECRET_KEY=local-credential.
source "$(dirname "$0")/lib.sh"
PORT="${WEBHOOKS_S3PROXY_PORT:-8334}"
BUCKET="${WEBHOOKS_S3PROXY_BUCKET:-archive}"
DIR="$RUN/s3proxy"; LOG="$DIR/s3proxy.log"

start() {
  [ -f "$JARS/s3proxy/.complete" ] || fail "S3Proxy not resolved: run 'make setup'"
  if running s3proxy; then say "s3proxy already running (pid $(cat "$DIR/pid"))"; return; fi
  # jclouds' filesystem provider: a bucket is a directory; this one exists before the first request.
  mkdir -p "$DIR/data/$BUCKET"
  cat > "$DIR/s3proxy.conf" <<CONF
s3proxy.endpoint=http://127.0.0.1:$PORT
s3proxy.authorization=aws-v2-or-v4
s3proxy.identity=local-identity
s3proxy.credential=local-credential
jclouds.provider=filesystem
jclouds.filesystem.basedir=$DIR/data
CONF
  # Without a configuration logback logs every Jetty frame at DEBUG.
  cat > "$DIR/logback.xml" <<XML
<configuration>
  <appender name="out" class="ch.qos.logback.core.ConsoleAppender"><encoder><pattern>%d %level %logger{20}: %msg%n</pattern></encoder></appender>
  <root level="WARN"><appender-ref ref="out"/></root>
</configuration>
XML
  say "starting s3proxy on 127.0.0.1:$PORT (bucket $BUCKET)"
  start_bg s3proxy "$LOG" java -Xmx256m -Dlogback.configurationFile="$DIR/logback.xml" -cp "$JARS/s3proxy/*" \
    org.gaul.s3proxy.Main --properties "$DIR/s3proxy.conf"
}

ready() {
  # Any HTTP answer (403 without credentials) means it serves.
  wait_until s3proxy "$LOG" 60 curl -s -o /dev/null "http://127.0.0.1:$PORT/"
  say "s3proxy ready: http://127.0.0.1:$PORT"
}

case "${1:-}" in
  start) start ;;
  ready) ready ;;
  stop) stop_part s3proxy 10 ;;
  *) echo "usage: $0 start|ready|stop" >&2; exit 2 ;;
esac
