#!/usr/bin/env bash
# Start/stop the archive tier's two processes (docs/archive.md): the archive writer
# (control_plane/archive/writer.py: the job's history facts from Kafka to Parquet, continuously)
# and the audit (control_plane/archive/audit.py, at each UTC hour + 5 min). `make run` starts
# them, `make down` stops them; `make up` and `make test` do not (the archive's tests run their
# own; the job's facts wait in Kafka meanwhile). Both push to the Pushgateway (alerts
# ArchiveLagHigh, ArchiveWriterDown, ArchiveAuditFailed, ArchiveAuditFailing).
# WEBHOOKS_ARCHIVE_AUDIT_EVERY_S changes the audit's period (e.g. 60 to watch it work).
source "$(dirname "$0")/lib.sh"
EVERY="${WEBHOOKS_ARCHIVE_AUDIT_EVERY_S:-3600}"
MARGIN="${WEBHOOKS_ARCHIVE_AUDIT_MARGIN_S:-$(( EVERY >= 3600 ? 300 : 0 ))}"

start_one() {  # <part> <ready line> <command...>
  local part="$1"; shift
  local log="$RUN/$part/$part.log"
  if running "$part"; then say "$part already running (pid $(cat "$RUN/$part/pid"))"; return; fi
  mkdir -p "$RUN/$part"
  if [ -f "$log" ]; then mv "$log" "$log.1"; fi  # `ready` looks for this start's first line
  say "starting $part (log $log)"
  start_bg "$part" "$log" "$@"
}

case "${1:-}" in
  start)
    start_one archive-writer "$PY" -m control_plane.archive.writer
    start_one archive-audit "$PY" -m control_plane.archive.audit --every "$EVERY" --margin "$MARGIN" ;;
  ready)
    wait_until archive-writer "$RUN/archive-writer/archive-writer.log" 30 grep -q "archive writer:" "$RUN/archive-writer/archive-writer.log"
    wait_until archive-audit "$RUN/archive-audit/archive-audit.log" 30 grep -q "archive audit:" "$RUN/archive-audit/archive-audit.log"
    say "archive writer and audit ready" ;;
  # The writer rolls what it holds on TERM (if the store answers); what it does not is read again.
  stop) stop_part archive-writer 30; stop_part archive-audit 30 ;;
  *) echo "usage: $0 start|ready|stop" >&2; exit 2 ;;
esac
