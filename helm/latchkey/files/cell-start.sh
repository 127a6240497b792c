#!/bin/sh
# Starts the latchkey-cell member of this StatefulSet pod (pod N is member
# N+1 of the bootstrap voters, or a learner past them).
#
# Why a script: latchkey-cell binds --peer-addr AND gives that same string
# to the other members as its address, and the address must be an IP
# (not a DNS name) that equals this member's --initial-cluster entry. In
# Kubernetes only the pod IP qualifies, and it changes whenever the pod is
# recreated. So this script
#   - on the first start of a voter, resolves every voter's stable DNS name
#     to its pod IP to build the same --initial-cluster on every voter;
#   - on a restart, tells the cell this member's new IP (member update);
#   - on the first start of a learner (or of a voter whose place was taken
#     out of the cell), adds itself as a learner and starts with --join.
#
# Environment (set by the StatefulSet): POD_IP, POD_NAME, CELL_STS (the
# StatefulSet's name), CELL_PEER_DOMAIN (<headless service>.<namespace>.svc.
# <cluster domain>), CELL_VOTERS, CELL_PODS (voters + learners),
# CELL_CLIENT_PORT, CELL_PEER_PORT, CELL_METRICS_PORT; optional
# CELL_RESTORE_FILE, CELL_DATA_ROOT (default /var/lib/latchkey),
# CELL_DNS_WAIT_SECONDS (default 300), CELL_LISTEN_IP (where the client and
# metrics ports listen; default every interface). Arguments are passed on to
# latchkey-cell. Other settings reach it as LATCHKEY_* variables.
set -eu

: "${POD_IP:?}" "${POD_NAME:?}" "${CELL_STS:?}" "${CELL_PEER_DOMAIN:?}"
: "${CELL_VOTERS:?}" "${CELL_PODS:?}" "${CELL_CLIENT_PORT:?}" "${CELL_PEER_PORT:?}" "${CELL_METRICS_PORT:?}"
root=${CELL_DATA_ROOT:-/var/lib/latchkey}
data=$root/data
ordinal=${POD_NAME##*-}

log() { echo "cell-start: $*" >&2; }
# etcdctl refuses to run when a flag it is given is also set in its
# environment (ETCDCTL_ENDPOINTS from extraEnv, say); the flags below win.
unset ETCDCTL_ENDPOINTS

# host:port with brackets around an IPv6 address, as the cell parses it.
with_port() {
  case "$1" in
    *:*) echo "[$1]:$2" ;;
    *) echo "$1:$2" ;;
  esac
}
peer_addr=$(with_port "$POD_IP" "$CELL_PEER_PORT")
peer_url="http://$peer_addr"

member_host() { echo "$CELL_STS-$1.$CELL_PEER_DOMAIN"; }

# Client URLs of the pods, all of them or all but this one.
client_urls() {
  urls="" i=0
  while [ "$i" -lt "$CELL_PODS" ]; do
    if [ "$1" = all ] || [ "$i" -ne "$ordinal" ]; then
      urls="${urls:+$urls,}http://$(member_host "$i"):$CELL_CLIENT_PORT"
    fi
    i=$((i + 1))
  done
  echo "$urls"
}
all_urls=$(client_urls all)
other_urls=$(client_urls others)

# etcdctl against the endpoints in $1.
ctl() {
  endpoints=$1
  shift
  etcdctl --endpoints="$endpoints" --dial-timeout=2s --command-timeout=5s "$@"
}

# The pod IP of a name, in the family of this pod's own IP.
resolve() {
  case "$POD_IP" in
    *:*) getent ahostsv6 "$1" ;;
    *) getent ahostsv4 "$1" ;;
  esac | awk 'NR == 1 { print $1 }'
}

# etcdctl's member list ("ID, status, name, peer URL, client URL,
# learner"), or nothing when no other member answers.
member_list() {
  [ -n "$other_urls" ] || return 0
  ctl "$other_urls" member list 2>/dev/null || true
}

# Tells the cell this member's current peer URL if the membership holds an
# older one (the pod came back with a new IP). `$1` = endpoints to ask.
update_peer_url() {
  list=$(ctl "$1" member list 2>/dev/null) || return 1
  line=$(printf '%s\n' "$list" | awk -F', ' -v name="$POD_NAME" '$3 == name')
  if [ -z "$line" ]; then
    log "the cell lists no member named $POD_NAME; not updating a peer URL"
    return 0
  fi
  id=$(printf '%s\n' "$line" | awk -F', ' '{ print $1 }')
  old=$(printf '%s\n' "$line" | awk -F', ' '{ print $4 }')
  [ "$old" = "$peer_url" ] && return 0
  log "member $id moved from $old to $peer_url; updating the cell"
  ctl "$1" member update "$id" --peer-urls="$peer_url" >/dev/null
}

# Adds this pod as a learner (unless a member already has its peer URL)
# and starts it with --join; it finds its id by its peer URL.
join_as_learner() {
  tries=0
  until printf '%s\n' "$(member_list)" | grep -q ", $peer_url, "; do
    if ctl "$other_urls" member add "$POD_NAME" --peer-urls="$peer_url" --learner >&2; then
      break
    fi
    tries=$((tries + 1))
    [ "$tries" -lt 60 ] || { log "could not add $peer_url to the cell"; exit 1; }
    sleep 2
  done
  log "joining as a learner at $peer_url; promote it with: etcdctl member promote ID"
  exec latchkey-cell --join "$other_urls" "$@"
}

# Clients and Prometheus reach every interface (kubectl port-forward and
# exec reach the pod's loopback); peers reach the pod IP only.
case "$POD_IP" in
  *:*) any=${CELL_LISTEN_IP:-::} ;;
  *) any=${CELL_LISTEN_IP:-0.0.0.0} ;;
esac
common_flags() {
  echo --data-dir "$data" --name "$POD_NAME" --peer-addr "$peer_addr" \
    --client-addr "$(with_port "$any" "$CELL_CLIENT_PORT")" \
    --metrics-addr "$(with_port "$any" "$CELL_METRICS_PORT")"
}
# shellcheck disable=SC2046 # word splitting is wanted: no value has spaces.
set -- $(common_flags) "$@"

# --- A member that has run before ---------------------------------------------
# Its data directory holds its id and the membership; --join is ignored then
# (it only matters to a member with no identity yet), and saves knowing
# whether this member was a bootstrap voter or joined later.
if [ -n "$(ls -A "$data" 2>/dev/null)" ]; then
  if [ -n "$other_urls" ] && update_peer_url "$other_urls"; then
    :
  else
    # Alone (a one-member cell) or no quorum among the others yet: keep
    # trying once this member serves too. It is reparented to the cell's
    # process when this script execs, and ends within ten minutes.
    (
      n=0
      until update_peer_url "$all_urls" || [ "$n" -ge 300 ]; do
        n=$((n + 1))
        sleep 2
      done
    ) &
  fi
  exec latchkey-cell --join "$all_urls" "$@"
fi

# --- First start ---------------------------------------------------------------
if [ "$ordinal" -ge "$CELL_VOTERS" ]; then
  join_as_learner "$@"
fi

# A voter. If the cell already runs (a member has published its name,
# which takes a leader), this pod's place may have been taken out of it.
my_id=$((ordinal + 1))
list=$(member_list)
if printf '%s\n' "$list" | grep -q ', started, '; then
  mine=$(printf '%s\n' "$list" | awk -F', ' -v id="$(printf '%x' "$my_id")" '$1 == id')
  if [ -z "$mine" ]; then
    log "member $my_id is not in the running cell; this pod joins it"
    join_as_learner "$@"
  fi
  if [ "$(printf '%s\n' "$mine" | awk -F', ' '{ print $4 }')" != "$peer_url" ]; then
    log "member $my_id of the running cell has another address and this pod has no data."
    log "To replace it: etcdctl member remove $(printf '%x' "$my_id"); this pod then joins as a learner."
    exit 1
  fi
fi

# Bootstrap: every voter builds the same --initial-cluster from the DNS
# names of the voters (the headless service publishes them before they are
# ready).
deadline=$(($(date +%s) + ${CELL_DNS_WAIT_SECONDS:-300}))
cluster="" i=0
while [ "$i" -lt "$CELL_VOTERS" ]; do
  ip=$(resolve "$(member_host "$i")" || true)
  if [ -z "$ip" ]; then
    [ "$(date +%s)" -lt "$deadline" ] || { log "$(member_host "$i") does not resolve"; exit 1; }
    sleep 1
    continue
  fi
  cluster="${cluster:+$cluster,}$((i + 1))=$(with_port "$ip" "$CELL_PEER_PORT")"
  i=$((i + 1))
done
log "bootstrapping member $my_id of $cluster"
if [ -n "${CELL_RESTORE_FILE:-}" ]; then
  set -- --restore "$CELL_RESTORE_FILE" "$@"
fi
exec latchkey-cell --id "$my_id" --initial-cluster "$cluster" "$@"
