# `make run LOCAL_RECEIVERS=1`: the one switch that lets the local stack deliver to a receiver on
# this machine (`webhookctl listen` on https://127.0.0.1:8443). Sourced by control_plane.sh and
# job.sh after lib.sh, not run.
#
# The egress policy refuses loopback and every port but 443 (core/egress.py), which is right for
# customer URLs and wrong for a receiver on the developer's own machine. The switch sets, for the
# control plane (which validates endpoint URLs) and the delivery job (which connects):
#   WEBHOOKS_EGRESS__DEV_ALLOW_CIDRS  ["127.0.0.1/32"]
#   WEBHOOKS_EGRESS__ALLOWED_PORTS    [443, 8443]          unless already set
#   WEBHOOKS_DISPATCH__CA_BUNDLE      $RUN/certs/ca.pem    unless already set: the dev CA that
#                                     signed the listener's certificate (stack/certs.py)
# Production mode refuses it here, and Settings refuses dev_allow_cidrs there too
# (production_problems). A part started with the switch keeps it until it is stopped: the marker
# file local-receivers in its directory records that, so `make run` without the switch warns that
# it is still on, and `make run LOCAL_RECEIVERS=1` against parts started without it says how to
# restart them instead of silently not applying it.

LOCAL_RECEIVER_PORT=8443

_local_receivers_warn() {
  printf '\033[33m[stack] WARNING: %s: LOCAL_RECEIVERS is on: it may deliver to 127.0.0.1 (ports %s) despite the SSRF policy. Development only; `make down` then `make run` turns it off.\033[0m\n' \
    "$1" "${WEBHOOKS_EGRESS__ALLOWED_PORTS:-[443, $LOCAL_RECEIVER_PORT]}" >&2
}

# local_receivers_apply <part> <part-dir>: before starting a part; exports the allowance when asked.
local_receivers_apply() {
  local part="$1" marker="$2/local-receivers"
  case "${LOCAL_RECEIVERS:-0}" in
    0) rm -f "$marker"; return 0 ;;
    1) ;;
    *) fail "LOCAL_RECEIVERS must be 1 (on) or 0 (off), not '${LOCAL_RECEIVERS}'" ;;
  esac
  if [ "${WEBHOOKS_MODE:-dev}" = production ]; then
    fail "LOCAL_RECEIVERS=1 is for the development stack: production mode refuses deliveries to 127.0.0.1"
  fi
  export WEBHOOKS_EGRESS__DEV_ALLOW_CIDRS='["127.0.0.1/32"]'
  export WEBHOOKS_EGRESS__ALLOWED_PORTS="${WEBHOOKS_EGRESS__ALLOWED_PORTS:-[443, $LOCAL_RECEIVER_PORT]}"
  export WEBHOOKS_DISPATCH__CA_BUNDLE="${WEBHOOKS_DISPATCH__CA_BUNDLE:-$RUN/certs/ca.pem}"
  mkdir -p "$2"
  touch "$marker"
  _local_receivers_warn "$part"
}

# local_receivers_check <part> <part-dir>: when the part already runs.
local_receivers_check() {
  local part="$1" marker="$2/local-receivers"
  if [ -f "$marker" ]; then
    _local_receivers_warn "$part"
  elif [ "${LOCAL_RECEIVERS:-0}" = 1 ]; then
    fail "$part already runs without LOCAL_RECEIVERS; to turn it on: make down, then make run LOCAL_RECEIVERS=1"
  fi
}
