#!/usr/bin/env bash
# Runs the chart's start script (helm/latchkey/files/cell-start.sh) as the
# StatefulSet would, against real latchkey-cell processes, each "pod" on
# its own 127.0.0.x and known by its name in a private /etc/hosts (which
# plays the headless service):
#
#   1. three voters bootstrap from their names alone (the names resolve only
#      once the members serve);
#   2. every member is killed at once and started again on its volume with
#      a NEW IP behind its name: the cell comes back by itself, elects a
#      leader and still holds what was written before;
#   3. a fourth pod past the voters adds itself as a learner by its name
#      and joins;
#   4. with --tls only: the members' certificate (a wildcard for their
#      names, as a cert-manager Secret holds it: tls.crt, tls.key, ca.crt)
#      is replaced on disk, and every member serves the new one within 10 s
#      without a restart, and still replicates.
#
#   scripts/test-cell-start.sh BIN_DIR [--tls]   # BIN_DIR holds latchkey-cell
#
# --tls runs it all with TLS on every port (client certificates required,
# mutual TLS between members), as the chart's tls.enabled starts members.
# Needs root (a private mount namespace for /etc/hosts), etcdctl and curl. Each
# scenario prints one "ok"/"FAIL" line; exits non-zero if any failed.
set -euo pipefail
cd "$(dirname "$0")/.."
bin_dir=${1:?usage: scripts/test-cell-start.sh BIN_DIR [--tls]}
tls=${2:-}
[ -x "$bin_dir/latchkey-cell" ] || { echo "no latchkey-cell in $bin_dir" >&2; exit 2; }
bin_dir=$(cd "$bin_dir" && pwd)

# Re-run inside a private mount namespace where /etc/hosts is ours.
if [ "${CELL_START_TEST_NS:-}" != 1 ]; then
  exec unshare --mount --propagation private env CELL_START_TEST_NS=1 "$0" "$@"
fi

work=$(mktemp -d)
pids=()
cleanup() {
  local p
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  # CELL_START_TEST_LOGS=DIR keeps the members' logs.
  [ -z "${CELL_START_TEST_LOGS:-}" ] || cp "$work"/pod-*.log "$CELL_START_TEST_LOGS"/
  rm -rf "$work"
}
trap cleanup EXIT

# The ports are free high ones, the same on every member (as in a pod).
client_port=$((20000 + RANDOM % 20000))
peer_port=$((client_port + 1))
metrics_port=$((client_port + 2))
domain=peers.test
hosts=$work/hosts
cp /etc/hosts "$hosts"
mount --bind "$hosts" /etc/hosts

# host ORDINAL IP: points lk-cell-ORDINAL.peers.test at IP (in place, so the
# bind mount sees it).
host() {
  local rest
  rest=$(grep -v " lk-cell-$1\.$domain\$" "$hosts" || true)
  printf '%s\n%s lk-cell-%s.%s\n' "$rest" "$2" "$1" "$domain" >"$hosts"
}

# With --tls: a CA and the members' wildcard certificate, laid out as the
# chart mounts a kubernetes.io/tls Secret.
scheme=http
tls_env=()
ctl_tls=()
if [ "$tls" = --tls ]; then
  scheme=https
  scripts/make-certs.sh "$work/ca" "member=DNS:*.$domain"
  mkdir -p "$work/tls"
  cp "$work/ca/member.pem" "$work/tls/tls.crt"
  cp "$work/ca/member-key.pem" "$work/tls/tls.key"
  cp "$work/ca/ca.pem" "$work/tls/ca.crt"
  tls_env=(LATCHKEY_CERT_FILE="$work/tls/tls.crt" LATCHKEY_KEY_FILE="$work/tls/tls.key"
    LATCHKEY_TRUSTED_CA_FILE="$work/tls/ca.crt" LATCHKEY_CLIENT_CERT_AUTH=true
    LATCHKEY_PEER_CERT_FILE="$work/tls/tls.crt" LATCHKEY_PEER_KEY_FILE="$work/tls/tls.key"
    LATCHKEY_PEER_TRUSTED_CA_FILE="$work/tls/ca.crt")
  ctl_tls=(--cacert="$work/tls/ca.crt" --cert="$work/tls/tls.crt" --key="$work/tls/tls.key")
fi

# start ORDINAL IP PODS: runs the start script as pod ORDINAL would, its
# ports on IP (in a pod: every interface).
start() {
  mkdir -p "$work/pod-$1"
  env -i PATH="$bin_dir:$PATH" POD_NAME="lk-cell-$1" POD_IP="$2" ${tls_env[@]+"${tls_env[@]}"} \
    CELL_STS=lk-cell CELL_PEER_DOMAIN="$domain" CELL_VOTERS=3 CELL_PODS="$3" \
    CELL_CLIENT_PORT="$client_port" CELL_PEER_PORT="$peer_port" CELL_METRICS_PORT="$metrics_port" \
    CELL_DATA_ROOT="$work/pod-$1" CELL_LISTEN_IP="$2" \
    LATCHKEY_ELECTION_TIMEOUT_MS=400 \
    sh helm/latchkey/files/cell-start.sh >>"$work/pod-$1.log" 2>&1 &
  pids[$1]=$!
}

passed=0
failed=0
check() {
  local name=$1; shift
  if "$@"; then
    passed=$((passed + 1)); echo "ok   cell-start: $name"
  else
    failed=$((failed + 1)); echo "FAIL cell-start: $name"
    tail -n 5 "$work"/pod-*.log | sed 's/^/     /'
  fi
}

# eventually SECONDS COMMAND...: COMMAND succeeds within SECONDS.
eventually() {
  local seconds=$1; shift
  local until=$(($(date +%s) + seconds))
  until "$@" >/dev/null 2>&1; do
    [ "$(date +%s)" -lt "$until" ] || { echo "     not within $seconds s: $*"; return 1; }
    sleep 0.5
  done
}

name() { echo "lk-cell-$1.$domain"; }
ep() { echo "$scheme://$(name "$1"):$client_port"; }
voters="$(ep 0),$(ep 1),$(ep 2)"
ctl() { etcdctl ${ctl_tls[@]+"${ctl_tls[@]}"} --dial-timeout=2s --command-timeout=5s "$@"; }
members() { ctl --endpoints="$voters" member list; }
# The member list line of pod ORDINAL, known by its name: id ORDINAL+1 for
# a voter, any id for a learner (LEARNER true).
listed() {
  local id=$(($1 + 1)) learner=${2:-false}
  [ "$learner" = false ] || id='[0-9a-f]*'
  members | grep -qx "$id, started, lk-cell-$1, $scheme://$(name "$1"):$peer_port, $scheme://$(name "$1"):$client_port, $learner"
}
# reads ORDINAL KEY VALUE [--consistency=s]: the member returns VALUE.
reads() { [ "$(ctl --endpoints="$(ep "$1")" get "$2" --print-value-only ${4:+"$4"})" = "$3" ]; }

# serves IP: the member on IP answers /healthz.
serves() { curl -sf "http://$1:$metrics_port/healthz" >/dev/null; }

# 1. Bootstrap. The members start, and serve, before their names resolve
# (a pod's DNS record may come after the pod): the script must not need them.
bootstrap() {
  local i
  for i in 0 1 2; do start "$i" "127.0.0.$((11 + i))" 3; done
  for i in 0 1 2; do eventually 30 serves "127.0.0.$((11 + i))" || return 1; done
  for i in 0 1 2; do host "$i" "127.0.0.$((11 + i))"; done
  eventually 60 ctl --endpoints="$voters" put k before-restart &&
    eventually 10 listed 0 && eventually 10 listed 1 && eventually 10 listed 2
}
check "three voters bootstrap from their DNS names, each member ordinal+1 at its name" bootstrap

# 2. Every pod recreated at once (say, all nodes lost), each with a new IP.
full_restart() {
  local i
  for i in 0 1 2; do kill -KILL "${pids[$i]}"; done
  for i in 0 1 2; do wait "${pids[$i]}" 2>/dev/null || true; done
  for i in 0 1 2; do host "$i" "127.0.0.$((21 + i))"; done
  for i in 0 1 2; do start "$i" "127.0.0.$((21 + i))" 3; done
  # A linearizable read on each member needs a leader that they all know.
  eventually 60 reads 0 k before-restart && eventually 10 reads 1 k before-restart &&
    eventually 10 reads 2 k before-restart &&
    eventually 10 ctl --endpoints="$voters" put k after-restart &&
    eventually 10 listed 0 && eventually 10 listed 1 && eventually 10 listed 2
}
check "every member killed at once and back with new IPs: a leader again, the earlier write kept" full_restart

# 3. A pod past the voters: a learner.
learner() {
  host 3 127.0.0.14
  start 3 127.0.0.14 4
  eventually 90 listed 3 true &&
    ctl --endpoints="$voters" put k learner >/dev/null &&
    eventually 30 reads 3 k learner --consistency=s
}
check "a pod past the voters adds itself as a learner by its name, joins and applies writes" learner

# 4. The Secret's certificate rotated (a new one from the same CA, the
# files replaced as the kubelet swaps a Secret volume).
# serial ORDINAL: the serial of the certificate pod ORDINAL's client port serves.
serial() {
  openssl s_client -connect "$(name "$1"):$client_port" -servername "$(name "$1")" \
    -CAfile "$work/tls/ca.crt" -cert "$work/tls/tls.crt" -key "$work/tls/tls.key" </dev/null 2>/dev/null |
    openssl x509 -noout -serial
}
# serves_other ORDINAL SERIAL: pod ORDINAL's client port serves another.
serves_other() { local now; now=$(serial "$1") && [ -n "$now" ] && [ "$now" != "$2" ]; }
rotation() {
  local before i
  before=$(serial 0)
  [ -n "$before" ] || { echo "     no certificate served"; return 1; }
  scripts/make-certs.sh "$work/ca" "rotated=DNS:*.$domain"
  cp "$work/ca/rotated-key.pem" "$work/tls/tls.key.new" && mv "$work/tls/tls.key.new" "$work/tls/tls.key"
  cp "$work/ca/rotated.pem" "$work/tls/tls.crt.new" && mv "$work/tls/tls.crt.new" "$work/tls/tls.crt"
  for i in 0 1 2 3; do eventually 10 serves_other "$i" "$before" || return 1; done
  ctl --endpoints="$voters" put k rotated >/dev/null &&
    eventually 10 reads 3 k rotated --consistency=s
}
if [ "$tls" = --tls ]; then
  check "the members' certificate replaced on disk: served within 10 s without a restart, replication goes on" rotation
fi

echo "test result: $([ "$failed" -eq 0 ] && echo ok || echo FAILED). $passed passed; $failed failed; (scripts/test-cell-start.sh $tls)"
[ "$failed" -eq 0 ]
