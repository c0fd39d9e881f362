#!/usr/bin/env bash
# Start/stop the history archiver (control_plane/archiver.py) in its schedule mode: one process
# that runs at each UTC hour + 5 min and archives every closed hour older than archive_after_s
# (nothing for the first 3 days of a fresh stack). `make run` starts it, `make down` stops it;
# `make test` does not (the archive's tests drive the archiver themselves). Its runs push their
# outcome to the Pushgateway (alerts ArchiveVerificationFailed, ArchiverFailing).
# WEBHOOKS_ARCHIVER_EVERY_S changes the period (e.g. 60 to watch it work).
source "$(dirname "$0")/lib.sh"
DIR="$RUN/archiver"; LOG="$DIR/archiver.log"
EVERY="${WEBHOOKS_ARCHIVER_EVERY_S:-3600}"
MARGIN="${WEBHOOKS_ARCHIVER_MARGIN_S:-$(( EVERY >= 3600 ? 300 : 0 ))}"

start() {
  if running archiver; then say "archiver already running (pid $(cat "$DIR/pid"))"; return; fi
  mkdir -p "$DIR"
  if [ -f "$LOG" ]; then mv "$LOG" "$LOG.1"; fi  # `ready` looks for this start's first line
  say "starting the archiver (a run every ${EVERY}s, ${MARGIN}s after each boundary; log $LOG)"
  start_bg archiver "$LOG" "$PY" -m control_plane.archiver --every "$EVERY" --margin "$MARGIN"
}

case "${1:-}" in
  start) start ;;
  # Up once it has parsed its options and is waiting for its first run.
  ready) wait_until archiver "$LOG" 30 grep -q "archiver shard" "$LOG"; say "archiver ready: $(tail -n 1 "$LOG")" ;;
  # A run stops between hours on TERM; one mid-hour when the grace ends is completed by the next.
  stop) stop_part archiver 30 ;;
  *) echo "usage: $0 start|ready|stop" >&2; exit 2 ;;
esac
