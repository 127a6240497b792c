#!/usr/bin/env bash
# Runs compat/etcd-go, the tests written against the official etcd Go client
# (go.etcd.io/etcd/client/v3 and its concurrency package), against:
#
#   scripts/test-etcd-compat.sh --etcd             # a new 3-member etcd 3.4 (Debian's etcd-server)
#   scripts/test-etcd-compat.sh --latchkey BIN     # a new 3-member cell of the latchkey-cell binary BIN
#   scripts/test-etcd-compat.sh --latchkey BIN --tls   # the same with TLS on every port (client
#                                                  # certificates required, mutual TLS between
#                                                  # members and from the proxy), certificates
#                                                  # from scripts/make-certs.sh
#   scripts/test-etcd-compat.sh --latchkey BIN --auth  # authentication on (etcdctl adds root, the
#                                                  # proxy's user, and enables it), every client
#                                                  # authenticates as root, the proxy as its user
#   scripts/test-etcd-compat.sh HOST:PORT,...      # a running cluster's client endpoints
#
# Arguments after `--` go to `go test` (e.g. `-- -run 'TestWatch|TestTxn'`).
# The clusters it starts live on free 127.0.0.1 ports with their data in a
# temporary directory; both are gone when it exits. It prints Go's verbose
# test output, then one closing line:
#
#   test result: ok. N passed; M failed;
#
# counting the top-level tests (one per API area), and exits non-zero if any
# failed. With --latchkey it also starts latchkey-proxy (from BIN's
# directory, default flags) in front of the cell and passes it as
# LATCHKEY_PROXY_ENDPOINT: TestHandoffRates reports the concurrency recipes'
# handoffs/s through it and straight to the members. COMPAT_GO_TIMEOUT (default 15m) bounds the go test run.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
mod=$root/compat/etcd-go

usage() {
  sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

mode="" bin="" eps="" tls="" auth=""
while [ $# -gt 0 ]; do
  case "$1" in
    --etcd) mode=etcd; shift ;;
    --tls) tls=1; shift ;;
    --auth) auth=1; shift ;;
    --latchkey) [ $# -ge 2 ] || usage; mode=latchkey; bin=$2; shift 2 ;;
    --) shift; break ;;
    -h|--help) usage ;;
    -*) echo "unknown option $1" >&2; usage ;;
    *) [ -z "$eps" ] || usage; mode=endpoints; eps=$1; shift ;;
  esac
done
[ -n "$mode" ] || usage
[ -z "$tls" ] || [ "$mode" = latchkey ] || { echo "--tls goes with --latchkey" >&2; usage; }
[ -z "$auth" ] || [ "$mode" = latchkey ] || { echo "--auth goes with --latchkey" >&2; usage; }
go_args=("$@")

# --- Go and the client modules ----------------------------------------------
GO=$(command -v go || true)
[ -n "$GO" ] || { [ -x /usr/local/go/bin/go ] && GO=/usr/local/go/bin/go; }
if [ -z "$GO" ]; then
  echo "go is missing: compat/etcd-go needs the Go toolchain named in its go.mod" >&2
  exit 1
fi
echo "== $("$GO" version)"
# Fetches what go.sum names from the module proxy when it is not cached yet.
(cd "$mod" && "$GO" mod download)
# Compile and vet the tests before starting any server.
(cd "$mod" && "$GO" vet ./...)

# --- Servers -------------------------------------------------------------------
work=$(mktemp -d)
pids=()
cleanup() {
  local p i
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for i in $(seq 100); do
    local alive=0
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    [ $alive = 0 ] && break
    sleep 0.1
  done
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Free loopback ports, none chosen twice in this run, all below the
# kernel's ephemeral range: a port inside it can be taken by any outgoing
# connection between this check and the server's bind (CI once saw
# "Address already in use" exactly so).
taken=" "
ephemeral_low=$(cut -f1 /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
[ "$ephemeral_low" -gt 12000 ] 2>/dev/null || ephemeral_low=32768
free_port() {
  local p
  while :; do
    p=$((10000 + RANDOM % (ephemeral_low - 10000)))
    case "$taken" in *" $p "*) continue ;; esac
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
      taken="$taken$p "
      echo "$p"
      return
    fi
  done
}

# Fails with the member's log when a started process is gone.
check_alive() {
  local i
  for i in "${!pids[@]}"; do
    if ! kill -0 "${pids[$i]}" 2>/dev/null; then
      local what="member $((i + 1))" log="$work/member-$((i + 1)).log"
      [ "$i" -lt 3 ] || { what="the proxy"; log="$work/proxy.log"; }
      echo "$what exited; its log:" >&2
      tail -n 40 "$log" >&2 || true
      exit 1
    fi
  done
}

# wait_ready URL... : each URL answers 200 within 60 s.
wait_ready() {
  local url deadline=$((SECONDS + 60))
  for url in "$@"; do
    until [ "$(curl -s -o /dev/null -m 2 -w '%{http_code}' "$url" || true)" = 200 ]; do
      check_alive
      if [ $SECONDS -ge $deadline ]; then
        echo "$url did not answer 200 within 60 s" >&2
        for i in 1 2 3; do echo "--- member $i log:" >&2; tail -n 20 "$work/member-$i.log" >&2 || true; done
        exit 1
      fi
      sleep 0.2
    done
  done
}

export LATCHKEY_FRESH=0
case "$mode" in
  etcd)
    if ! command -v etcd >/dev/null 2>&1; then
      SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
      echo "installing etcd-server" >&2
      DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq etcd-server >/dev/null 2>&1 ||
        { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq etcd-server >/dev/null; }
    fi
    echo "== $(etcd --version | sed -n 1p)"
    cports=() pports=() cluster=""
    for i in 1 2 3; do
      cports+=("$(free_port)"); pports+=("$(free_port)")
      cluster="$cluster${cluster:+,}m$i=http://127.0.0.1:${pports[$((i - 1))]}"
    done
    for i in 1 2 3; do
      c=${cports[$((i - 1))]} p=${pports[$((i - 1))]}
      etcd --name "m$i" --data-dir "$work/etcd-$i" \
        --listen-client-urls "http://127.0.0.1:$c" --advertise-client-urls "http://127.0.0.1:$c" \
        --listen-peer-urls "http://127.0.0.1:$p" --initial-advertise-peer-urls "http://127.0.0.1:$p" \
        --initial-cluster "$cluster" --initial-cluster-state new --initial-cluster-token "compat-$$" \
        --experimental-watch-progress-notify-interval 1s \
        --logger zap --log-outputs stderr --log-level warn >"$work/member-$i.log" 2>&1 &
      pids+=($!)
    done
    ready_urls=()
    for c in "${cports[@]}"; do ready_urls+=("http://127.0.0.1:$c/health"); done
    ;;
  latchkey)
    [ -x "$bin" ] || { echo "$bin is not an executable latchkey-cell binary" >&2; exit 1; }
    cports=() pports=() mports=() cluster=""
    for i in 1 2 3; do
      cports+=("$(free_port)"); pports+=("$(free_port)"); mports+=("$(free_port)")
      cluster="$cluster${cluster:+,}$i=127.0.0.1:${pports[$((i - 1))]}"
    done
    cell_tls=() proxy_tls=()
    if [ -n "$tls" ]; then
      certs=$work/certs
      scripts/make-certs.sh "$certs" member=IP:127.0.0.1 proxy=IP:127.0.0.1 client=DNS:compat-client
      cell_tls=(--cert-file "$certs/member.pem" --key-file "$certs/member-key.pem"
        --trusted-ca-file "$certs/ca.pem" --client-cert-auth
        --peer-cert-file "$certs/member.pem" --peer-key-file "$certs/member-key.pem"
        --peer-trusted-ca-file "$certs/ca.pem")
      proxy_tls=(--cert-file "$certs/proxy.pem" --key-file "$certs/proxy-key.pem"
        --trusted-ca-file "$certs/ca.pem" --client-cert-auth
        --cacert "$certs/ca.pem" --cert "$certs/proxy.pem" --key "$certs/proxy-key.pem")
      export LATCHKEY_TLS_CA=$certs/ca.pem LATCHKEY_TLS_CERT=$certs/client.pem LATCHKEY_TLS_KEY=$certs/client-key.pem
    fi
    # The members admit, and the proxy presents, this key for latchkey's
    # own records (clients do not hold it).
    (umask 077; head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$work/proxy.key")
    # etcd limits requests (1.5 MiB), not values; latchkey also limits
    # values, to 64 KiB by default (a coordination store keeps small
    # values). Here values may be as large as etcd allows.
    for i in 1 2 3; do
      "$bin" --id "$i" --data-dir "$work/latchkey-$i" \
        --client-addr "127.0.0.1:${cports[$((i - 1))]}" --peer-addr "127.0.0.1:${pports[$((i - 1))]}" \
        --metrics-addr "127.0.0.1:${mports[$((i - 1))]}" --initial-cluster "$cluster" \
        --watch-progress-notify-interval-ms 1000 --max-value-bytes 1572864 \
        --proxy-key-file "$work/proxy.key" ${cell_tls[@]+"${cell_tls[@]}"} --log warn >"$work/member-$i.log" 2>&1 &
      pids+=($!)
    done
    ready_urls=()
    for m in "${mports[@]}"; do ready_urls+=("http://127.0.0.1:$m/readyz"); done
    # A proxy in front of the cell with its default flags, for the handoff
    # rates: the proxy binary built next to the cell's.
    proxy_bin=$(dirname "$bin")/latchkey-proxy
    [ -x "$proxy_bin" ] || { echo "$proxy_bin is missing: build latchkey-proxy with the cell" >&2; exit 1; }
    proxy_port=$(free_port) proxy_http=$(free_port) proxy_metrics=$(free_port)
    proxy_auth=()
    if [ -n "$auth" ]; then
      echo "compat-proxy-$$" >"$work/proxy-password"
      proxy_auth=(--cell-user latchkey-proxy --cell-password-file "$work/proxy-password")
    fi
    "$proxy_bin" ${proxy_auth[@]+"${proxy_auth[@]}"} --proxy-key-file "$work/proxy.key" --grpc-addr "127.0.0.1:$proxy_port" --http-addr "127.0.0.1:$proxy_http" \
      --metrics-addr "127.0.0.1:$proxy_metrics" ${proxy_tls[@]+"${proxy_tls[@]}"} \
      --cells "$(printf '127.0.0.1:%s,' "${cports[@]}" | sed 's/,$//')" >"$work/proxy.log" 2>&1 &
    pids+=($!)
    # /readyz on the metrics port: plain text with or without --tls.
    ready_urls+=("http://127.0.0.1:$proxy_metrics/readyz")
    ;;
esac
# A cluster started here: wait until every member answers, then test it.
if [ -n "${ready_urls+set}" ]; then
  wait_ready "${ready_urls[@]}"
  eps=$(printf '127.0.0.1:%s,' "${cports[@]}"); eps=${eps%,}
  export LATCHKEY_FRESH=1 LATCHKEY_PROGRESS_NOTIFY_INTERVAL=1s
  [ -z "${proxy_port:-}" ] || export LATCHKEY_PROXY_ENDPOINT=127.0.0.1:$proxy_port
fi
if [ -n "$auth" ]; then
  # etcdctl as an operator would: root, then authentication on (etcdctl
  # adds the root role and grants it).
  ctl=(etcdctl --endpoints="$eps" --command-timeout=20s)
  [ -z "$tls" ] || ctl+=(--cacert "$LATCHKEY_TLS_CA" --cert "$LATCHKEY_TLS_CERT" --key "$LATCHKEY_TLS_KEY")
  export ETCDCTL_API=3
  "${ctl[@]}" --interactive=false user add "root:compat-root-$$" >/dev/null
  # The proxy's own user: root, and the role that writes latchkey's records.
  "${ctl[@]}" --interactive=false user add "latchkey-proxy:compat-proxy-$$" >/dev/null
  "${ctl[@]}" role add root >/dev/null
  "${ctl[@]}" role add latchkey-proxy >/dev/null
  "${ctl[@]}" user grant-role root root >/dev/null
  "${ctl[@]}" user grant-role latchkey-proxy root >/dev/null
  "${ctl[@]}" user grant-role latchkey-proxy latchkey-proxy >/dev/null
  "${ctl[@]}" auth enable
  export LATCHKEY_USER=root LATCHKEY_PASSWORD=compat-root-$$
  # The proxy learns within a second that authentication is on and
  # authenticates: a lock through it as root needs both.
  deadline=$((SECONDS + 30))
  until "${ctl[@]}" --endpoints="127.0.0.1:$proxy_port" --user "root:compat-root-$$" \
      lock compat-proxy-ready true >/dev/null 2>&1; do
    [ $SECONDS -lt $deadline ] || { echo "the proxy did not act for an authenticated client within 30 s" >&2; tail -n 20 "$work/proxy.log" >&2; exit 1; }
    sleep 0.2
  done
  # Auth changes are txns of the keyspace in latchkey (etcd keeps them
  # apart): the cell's revision has moved on.
  export LATCHKEY_FRESH=0
fi

# --- Tests -----------------------------------------------------------------------
echo "== endpoints $eps"
log="$work/go-test.log"
start=$SECONDS
set +e
(cd "$mod" && "$GO" test -count=1 -v -timeout "${COMPAT_GO_TIMEOUT:-15m}" "${go_args[@]}" ./... \
  -args -endpoints="$eps") 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
set -e
passed=$(grep -cE '^--- PASS: Test' "$log" || true)
failed=$(grep -cE '^--- FAIL: Test' "$log" || true)
if [ "$rc" != 0 ] && [ "$failed" = 0 ]; then
  # A panic, a timeout or a build failure ends the run outside any test.
  echo "go test exited $rc with no failed test reported: counting the run as one failure" >&2
  failed=1
fi
if [ "$failed" != 0 ]; then
  echo "failed tests:"
  grep -E '^ *--- FAIL: ' "$log" || true
  if [ "$mode" != endpoints ]; then
    for i in 1 2 3; do
      echo "--- member $i log (last 15 lines):"
      tail -n 15 "$work/member-$i.log" || true
    done
    if [ -f "$work/proxy.log" ]; then
      echo "--- proxy log (last 15 lines):"
      tail -n 15 "$work/proxy.log" || true
    fi
  fi
fi
echo "== $mode${tls:+ with TLS}: $((SECONDS - start)) s"
if [ "$failed" = 0 ]; then
  echo "test result: ok. $passed passed; $failed failed;"
else
  echo "test result: FAILED. $passed passed; $failed failed;"
  exit 1
fi
