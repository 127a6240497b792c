#!/usr/bin/env bash
# Runs the chart's start script (helm/latchkey/files/cell-start.sh) as the
# StatefulSet would, against real latchkey-cell processes on 127.0.0.x:
#
#   1. three voters bootstrap from their DNS names (a private /etc/hosts
#      plays the headless service);
#   2. pod 2 is "recreated" with a new IP on its old volume: the script
#      must update its peer URL, and the member must catch up;
#   3. a fourth pod past the voters adds itself as a learner and joins.
#
#   scripts/test-cell-start.sh BIN_DIR     # BIN_DIR holds latchkey-cell
#
# Needs root (a private mount namespace for /etc/hosts) and etcdctl. Each
# step prints one "ok"/"FAIL" line; exits non-zero if any failed.
set -euo pipefail
cd "$(dirname "$0")/.."
bin_dir=${1:?usage: scripts/test-cell-start.sh BIN_DIR}
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

# start ORDINAL IP PODS: runs the start script as pod ORDINAL would.
start() {
  mkdir -p "$work/pod-$1"
  env -i PATH="$bin_dir:$PATH" POD_NAME="lk-cell-$1" POD_IP="$2" \
    CELL_STS=lk-cell CELL_PEER_DOMAIN="$domain" CELL_VOTERS=3 CELL_PODS="$3" \
    CELL_CLIENT_PORT="$client_port" CELL_PEER_PORT="$peer_port" CELL_METRICS_PORT="$metrics_port" \
    CELL_DATA_ROOT="$work/pod-$1" CELL_LISTEN_IP="$2" CELL_DNS_WAIT_SECONDS=30 \
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
  local until=$(($(date +%s) + $1)); shift
  until "$@" >/dev/null 2>&1; do
    [ "$(date +%s)" -lt "$until" ] || return 1
    sleep 0.5
  done
}

ep() { echo "lk-cell-$1.$domain:$client_port"; }
voters="$(ep 0),$(ep 1),$(ep 2)"
ctl() { etcdctl --dial-timeout=2s --command-timeout=5s "$@"; }
members() { ctl --endpoints="$voters" member list; }
peer_url_of() { members | awk -F', ' -v n="lk-cell-$1" '$3 == n { print $4 }'; }
has_peer_url() { [ "$(peer_url_of "$1")" = "$2" ]; }
reads() { [ "$(ctl --endpoints="$(ep "$1")" get "$2" --consistency=s --print-value-only)" = "$3" ]; }

for i in 0 1 2; do host "$i" "127.0.0.$((11 + i))"; done
for i in 0 1 2; do start "$i" "127.0.0.$((11 + i))" 3; done
check "three voters bootstrap from their DNS names" \
  eventually 60 ctl --endpoints="$voters" put k v1
check "each voter is member ordinal+1 at its pod IP" \
  eventually 10 bash -c "$(declare -f ctl members); domain=$domain; voters=$voters
    members | grep -q '^1, started, lk-cell-0, http://127.0.0.11:$peer_port, ' &&
    members | grep -q '^2, started, lk-cell-1, http://127.0.0.12:$peer_port, ' &&
    members | grep -q '^3, started, lk-cell-2, http://127.0.0.13:$peer_port, '"

# Pod 2 is recreated: new IP, same volume.
kill "${pids[2]}"; wait "${pids[2]}" 2>/dev/null || true
host 2 127.0.0.23
ctl --endpoints="$(ep 0)" put k v2 >/dev/null
start 2 127.0.0.23 3
check "a restarted member tells the cell its new IP" \
  eventually 60 has_peer_url 2 "http://127.0.0.23:$peer_port"
check "the restarted member catches up at its new IP" \
  eventually 30 reads 2 k v2

# A pod past the voters: a learner.
host 3 127.0.0.14
start 3 127.0.0.14 4
check "a pod past the voters adds itself as a learner and joins" \
  eventually 90 bash -c "$(declare -f ctl members); domain=$domain; voters=$voters
    members | grep -q ', started, lk-cell-3, http://127.0.0.14:$peer_port, .*, true\$'"
ctl --endpoints="$voters" put k v3 >/dev/null || true
check "the learner applies the cell's writes" \
  eventually 30 reads 3 k v3

echo "test result: $([ "$failed" -eq 0 ] && echo ok || echo FAILED). $passed passed; $failed failed; (scripts/test-cell-start.sh)"
[ "$failed" -eq 0 ]
