#!/bin/sh
# Starts the latchkey-cell member of this StatefulSet pod (pod N is member
# N+1 of the bootstrap voters, or a learner past them).
#
# Members know each other by the pods' stable DNS names
# (<pod>.<headless service>...), not by pod IP: each member binds every
# interface and advertises its name (--advertise-peer-addr,
# --advertise-client-addr), and the cell looks a name up again whenever it
# connects, so a pod recreated with a new IP, or every pod at once, is
# found again by its name. This script only picks the start:
#   - a pod with data restarts from it;
#   - on its first start a voter bootstraps with the same --initial-cluster
#     as every other voter, built from their names;
#   - on its first start a learner (or a voter whose place was taken out of
#     the cell) adds itself as a learner and starts with --join;
#   - a pod without data whose member has already run in the cell (its
#     volume was lost) is refused: it must be removed and replaced.
#
# Environment (set by the StatefulSet): POD_IP (only its address family
# matters: IPv6 binds [::]), POD_NAME, CELL_STS (the StatefulSet's name),
# CELL_PEER_DOMAIN (<headless service>.<namespace>.svc.<cluster domain>),
# CELL_VOTERS, CELL_PODS (voters + learners), CELL_CLIENT_PORT,
# CELL_PEER_PORT, CELL_METRICS_PORT; optional CELL_RESTORE_FILE,
# CELL_DATA_ROOT (default /var/lib/latchkey), CELL_LISTEN_IP (the address
# the three ports bind; default every interface). Arguments are passed on
# to latchkey-cell. Other settings reach it as LATCHKEY_* variables; with
# LATCHKEY_CERT_FILE (the chart's tls.enabled) the client ports speak
# https and etcdctl here presents LATCHKEY_CERT_FILE/LATCHKEY_KEY_FILE and
# trusts LATCHKEY_TRUSTED_CA_FILE; with LATCHKEY_PEER_CERT_FILE the peer
# URLs are https:// too.
set -eu

: "${POD_IP:?}" "${POD_NAME:?}" "${CELL_STS:?}" "${CELL_PEER_DOMAIN:?}"
: "${CELL_VOTERS:?}" "${CELL_PODS:?}" "${CELL_CLIENT_PORT:?}" "${CELL_PEER_PORT:?}" "${CELL_METRICS_PORT:?}"
root=${CELL_DATA_ROOT:-/var/lib/latchkey}
data=$root/data
ordinal=${POD_NAME##*-}

log() { echo "cell-start: $*" >&2; }
# etcdctl refuses to run when a flag it is given is also set in its
# environment (ETCDCTL_ENDPOINTS from extraEnv, say); the flags below win.
unset ETCDCTL_ENDPOINTS ETCDCTL_CACERT ETCDCTL_CERT ETCDCTL_KEY
scheme=http
[ -z "${LATCHKEY_CERT_FILE:-}" ] || scheme=https
peer_scheme=http
[ -z "${LATCHKEY_PEER_CERT_FILE:-}" ] || peer_scheme=https

# host:port with brackets around an IPv6 address, as the cell parses it.
with_port() {
  case "$1" in
    *:*) echo "[$1]:$2" ;;
    *) echo "$1:$2" ;;
  esac
}
member_host() { echo "$CELL_STS-$1.$CELL_PEER_DOMAIN"; }
me=$(member_host "$ordinal")
peer_url="$peer_scheme://$me:$CELL_PEER_PORT"

# Client URLs of the pods, all of them or all but this one.
client_urls() {
  urls="" i=0
  while [ "$i" -lt "$CELL_PODS" ]; do
    if [ "$1" = all ] || [ "$i" -ne "$ordinal" ]; then
      urls="${urls:+$urls,}$scheme://$(member_host "$i"):$CELL_CLIENT_PORT"
    fi
    i=$((i + 1))
  done
  echo "$urls"
}
other_urls=$(client_urls others)

ctl() {
  if [ "$scheme" = https ]; then
    set -- --cacert="${LATCHKEY_TRUSTED_CA_FILE:?}" --cert="$LATCHKEY_CERT_FILE" \
      --key="${LATCHKEY_KEY_FILE:?}" "$@"
  fi
  etcdctl --endpoints="$other_urls" --dial-timeout=2s --command-timeout=5s "$@"
}

# etcdctl's member list of the others ("ID, status, name, peer URL, client
# URL, learner"), or nothing when none answers.
member_list() {
  [ -n "$other_urls" ] || return 0
  ctl member list 2>/dev/null || true
}

case "$POD_IP" in
  *:*) any=${CELL_LISTEN_IP:-::} ;;
  *) any=${CELL_LISTEN_IP:-0.0.0.0} ;;
esac
set -- --data-dir "$data" --name "$POD_NAME" \
  --peer-addr "$(with_port "$any" "$CELL_PEER_PORT")" --advertise-peer-addr "$me:$CELL_PEER_PORT" \
  --client-addr "$(with_port "$any" "$CELL_CLIENT_PORT")" --advertise-client-addr "$me:$CELL_CLIENT_PORT" \
  --metrics-addr "$(with_port "$any" "$CELL_METRICS_PORT")" "$@"

# --- A member that has run before ---------------------------------------------
# Its data directory holds its id and the membership. The cell wants
# --initial-cluster or --join, and ignores --join once it has an identity;
# --join is right for every pod, voter or learner.
if [ -n "$(ls -A "$data" 2>/dev/null)" ]; then
  exec latchkey-cell --join "$(client_urls all)" "$@"
fi

# --- First start ---------------------------------------------------------------
# Members publish their name once they run ("started"); one not yet run is
# "unstarted".
list=$(member_list)
mine=$(printf '%s\n' "$list" | awk -F', ' -v url="$peer_url" '$4 == url')
if [ "$(printf '%s\n' "$mine" | awk -F', ' '{ print $2 }')" = started ]; then
  id=$(printf '%s\n' "$mine" | awk -F', ' '{ print $1 }')
  log "member $id ($peer_url) has run before, but this pod has no data (its volume was lost)."
  log "To replace it: etcdctl member remove $id; this pod then joins as a learner."
  exit 1
fi

my_id=$((ordinal + 1))
if [ "$ordinal" -lt "$CELL_VOTERS" ]; then
  # A voter bootstraps, unless the cell already runs without it (its place
  # was taken out): then it joins as a learner below.
  if ! printf '%s\n' "$list" | grep -q ', started, ' ||
    [ "$(printf '%s\n' "$mine" | awk -F', ' '{ print $1 }')" = "$(printf '%x' "$my_id")" ]; then
    cluster="" i=0
    while [ "$i" -lt "$CELL_VOTERS" ]; do
      cluster="${cluster:+$cluster,}$((i + 1))=$(member_host "$i"):$CELL_PEER_PORT"
      i=$((i + 1))
    done
    log "bootstrapping member $my_id of $cluster"
    if [ -n "${CELL_RESTORE_FILE:-}" ]; then
      set -- --restore "$CELL_RESTORE_FILE" "$@"
    fi
    exec latchkey-cell --id "$my_id" --initial-cluster "$cluster" "$@"
  fi
  log "member $my_id is not in the running cell; this pod joins it"
fi

# A learner: add this pod (unless a former attempt did), then --join; the
# cell finds its id by its peer URL.
tries=0
until [ -n "$mine" ]; do
  if ctl member add "$POD_NAME" --peer-urls="$peer_url" --learner >&2; then
    break
  fi
  tries=$((tries + 1))
  [ "$tries" -lt 60 ] || { log "could not add $peer_url to the cell"; exit 1; }
  sleep 2
  mine=$(member_list | awk -F', ' -v url="$peer_url" '$4 == url')
done
log "joining as a learner at $peer_url; promote it with: etcdctl member promote ID"
exec latchkey-cell --join "$other_urls" "$@"
