#!/usr/bin/env bash
# Start/stop the local producer database: Debian's PostgreSQL server binaries, a cluster in
# .run/postgres/ on 127.0.0.1 (port 55432, clear of a system PostgreSQL on 5432), wal_level=logical
# for Debezium. PostgreSQL refuses to run as root, so as root the cluster belongs to the `postgres`
# system user the Debian package creates.
source "$(dirname "$0")/lib.sh"
PORT="${WEBHOOKS_POSTGRES_PORT:-55432}"
DIR="$RUN/postgres"; LOG="$DIR/postgres.log"

pg_bin() {
  local d; d="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)"
  [ -n "$d" ] && [ -x "$d/postgres" ] || fail "PostgreSQL server not found: run 'make setup' (apt-get install postgresql)"
  echo "$d"
}

# as_owner <cmd...>: run as the cluster's owner (postgres when we are root), exec'd in place so a
# recorded pid is the server's own.
as_owner() {
  if [ "$(id -u)" = 0 ]; then exec setpriv --reuid=postgres --regid=postgres --init-groups --reset-env \
      env PATH="$PATH" "$@"; else exec "$@"; fi
}

# home: where the cluster lives -- .run/postgres/ when its owner can reach it. As root in a
# checkout under a private directory (mktemp -d makes 0700 ones) the postgres user cannot, and
# then the cluster goes under postgres's own home, named after this checkout, with .run/postgres/
# recording where (`make clean` removes it with the rest: `stack/postgres.sh destroy`).
home() {
  if [ -f "$DIR/home" ]; then cat "$DIR/home"; return; fi
  mkdir -p "$DIR"
  local h="$DIR"
  if [ "$(id -u)" = 0 ]; then
    chown postgres:postgres "$DIR"
    if ! setpriv --reuid=postgres --regid=postgres --init-groups test -w "$DIR" 2>/dev/null; then
      h="$(getent passwd postgres | cut -d: -f6)/webhooks-$(echo "$RUN" | sha256sum | cut -c1-12)"
      mkdir -p "$h" && chown postgres:postgres "$h"
    fi
  fi
  echo "$h" > "$DIR/home"
  echo "$h"
}

start() {
  local bin; bin="$(pg_bin)"
  if running postgres; then say "postgres already running (pid $(cat "$DIR/pid"))"; return; fi
  local h; h="$(home)"; local DATA="$h/data"
  if [ ! -f "$DATA/PG_VERSION" ]; then
    say "initialising postgres cluster in $DATA"
    # trust on 127.0.0.1 only, like the local Kafka and Cassandra; a deployment's DSN carries
    # credentials (WEBHOOKS_OUTBOX__DSN).
    ( as_owner "$bin/initdb" -D "$DATA" -U webhooks --auth=trust -E UTF8 --locale=C.UTF-8 ) >>"$LOG" 2>&1 \
      || explain_failure postgres "$LOG" "initdb failed"
  fi
  say "starting postgres on 127.0.0.1:$PORT"
  start_bg postgres "$LOG" bash -c "$(declare -f as_owner); as_owner \"\$@\"" _ "$bin/postgres" -D "$DATA" \
    -c listen_addresses=127.0.0.1 -c port="$PORT" -c unix_socket_directories="$h" \
    -c wal_level=logical -c max_replication_slots=8 -c max_wal_senders=8 \
    -c shared_buffers=128MB
}

ready() {
  local bin; bin="$(pg_bin)"
  wait_until postgres "$LOG" 60 "$bin/pg_isready" -q -h 127.0.0.1 -p "$PORT" -U webhooks -d postgres
  say "postgres ready"
}

# Fast shutdown (SIGINT): a smart one (SIGTERM) would wait for Debezium's replication connection.
stop() {
  local f="$DIR/pid"
  if [ -f "$f" ] && pid_alive "$(cat "$f")"; then
    local pid i=0; pid="$(cat "$f")"
    say "stopping postgres (pid $pid)"
    kill -INT "$pid" 2>/dev/null || true
    while pid_alive "$pid" && (( i < 150 )); do sleep 0.2; i=$((i+1)); done
  fi
  stop_part postgres 10
}

destroy() {
  stop
  if [ -f "$DIR/home" ]; then rm -rf "$(cat "$DIR/home")"; fi
  rm -rf "$DIR"
}

case "${1:-}" in
  start) start ;;
  ready) ready ;;
  stop) stop ;;
  destroy) destroy ;;
  *) echo "usage: $0 start|ready|stop|destroy" >&2; exit 2 ;;
esac
