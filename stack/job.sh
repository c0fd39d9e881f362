#!/usr/bin/env bash
# Submit, stop (with savepoint), rescale or list the delivery job on the local Flink cluster.
# submit resumes from the newest savepoint or retained checkpoint, so `make down` + `make run`
# keeps pending deliveries and retry timers (they live in Flink state). `rescale N` changes the
# running job's parallelism in place (the adaptive scheduler restarts it from its next checkpoint;
# stack/flink_jobs.py); a later submit uses WEBHOOKS_FLINK__PARALLELISM again.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/local_receivers.sh"
eval "$("$REPO/stack/flink.sh" env)"
export PATH="$VENV/bin:$PATH"
REST="http://127.0.0.1:${WEBHOOKS_FLINK_REST_PORT:-8081}"
JOB_NAME="${WEBHOOKS_FLINK__JOB_NAME:-webhooks-delivery}"
# Each topology keeps its job's restore points apart: they hold Kafka offsets of its own brokers.
STATE="$RUN/flink/state-$JOB_NAME"
if [ "$TOPOLOGY" != single ]; then STATE="$RUN/flink/state-$TOPOLOGY-$JOB_NAME"; fi
mkdir -p "$STATE"

running_job_id() {
  "$PY" - "$REST" "$JOB_NAME" <<'PY'
import json, sys, urllib.request
jobs = json.load(urllib.request.urlopen(sys.argv[1] + "/jobs/overview", timeout=5))["jobs"]
ids = [j["jid"] for j in jobs if j["name"] == sys.argv[2] and j["state"] in ("RUNNING", "CREATED", "RESTARTING", "INITIALIZING")]
print(ids[0] if ids else "")
PY
}

# Newest restore point: a savepoint we took, or a checkpoint Flink retained after a crash.
restore_point() {
  { ls -1dt "$STATE"/savepoints/savepoint-* "$STATE"/checkpoints/*/chk-* 2>/dev/null || true; } | head -n 1
}

submit() {
  local jid; jid="$(running_job_id)"
  if [ -n "$jid" ]; then say "job $JOB_NAME already running ($jid)"; local_receivers_check "job $JOB_NAME" "$STATE"; return; fi
  local_receivers_apply "job $JOB_NAME" "$STATE"
  tracing_apply
  local from; from="$(restore_point)"
  local args=(run -d -py "$REPO/jobs/delivery_job.py" -pyfs "$REPO/core,$REPO/operators,$REPO/jobs,$REPO/tracing")
  if [ -n "$from" ]; then say "resuming $JOB_NAME from $from"; args+=(-s "$from"); fi
  say "submitting $JOB_NAME"
  WEBHOOKS_FLINK__JOB_NAME="$JOB_NAME" WEBHOOKS_FLINK__CHECKPOINT_DIR="file://$STATE/checkpoints" \
    "$FLINK_HOME/bin/flink" "${args[@]}" > "$STATE/submit.log" 2>&1 \
    || explain_failure "job $JOB_NAME" "$STATE/submit.log" "flink run failed"
  local i=0
  until [ -n "$(running_job_id)" ]; do
    i=$((i+1)); (( i > 60 )) && explain_failure "job $JOB_NAME" "$STATE/submit.log" "not running after 60s"
    sleep 1
  done
  say "job $JOB_NAME running ($(running_job_id))"
}

stop() {
  local jid; jid="$(running_job_id)"
  [ -n "$jid" ] || { say "job $JOB_NAME not running"; return; }
  say "stopping $JOB_NAME with a savepoint"
  "$FLINK_HOME/bin/flink" stop --savepointPath "file://$STATE/savepoints" "$jid" > "$STATE/stop.log" 2>&1 \
    || explain_failure "job $JOB_NAME" "$STATE/stop.log" "stop with savepoint failed"
}

rescale() {
  local n="${1:?usage: $0 rescale <parallelism>}"
  local jid; jid="$(running_job_id)"
  [ -n "$jid" ] || fail "job $JOB_NAME not running"
  say "rescaling $JOB_NAME ($jid) to parallelism $n"
  (cd "$REPO" && "$PY" -m stack.flink_jobs rescale "$jid" "$n") || fail "rescale of $JOB_NAME to $n failed"
}

case "${1:-}" in
  submit) submit ;;
  stop) stop ;;
  rescale) rescale "${2:-}" ;;
  id) running_job_id ;;
  cancel-all) running flink-jm && stop || true ;;
  *) echo "usage: $0 submit|stop|rescale <parallelism>|id" >&2; exit 2 ;;
esac
