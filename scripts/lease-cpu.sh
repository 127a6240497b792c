#!/usr/bin/env bash
# Server CPU for keeping many leases alive at a 10 s keep-alive interval:
# a latchkey cell refreshed by latchkey's batched refresh extension, next
# to an etcd server refreshed with etcd's keep-alive stream (one message
# per lease per interval, as etcd's Go client does). Both are one-member
# servers on 127.0.0.1 of this machine.
#
#   scripts/lease-cpu.sh            # 100 000 leases, 60 s each
#   LEASES=20000 DURATION=30 scripts/lease-cpu.sh
set -euo pipefail
cd "$(dirname "$0")/.."
LEASES=${LEASES:-100000}
DURATION=${DURATION:-60}
INTERVAL=${INTERVAL:-10}

bash scripts/install-deps.sh
if ! command -v etcd >/dev/null 2>&1; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq etcd-server >/dev/null
fi
cargo build -q -p latchkey-cell --bin latchkey-cell --example lease_refresh_cpu
TARGET=${CARGO_TARGET_DIR:-target}/debug

work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

wait_port() {
  for _ in $(seq 100); do
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    sleep 0.1
  done
  echo "nothing listens on $1" >&2; return 1
}

echo "== latchkey-cell (debug build), batched refresh"
"$TARGET/latchkey-cell" --dev --data-dir "$work/latchkey" --client-addr 127.0.0.1:17801 \
  --peer-addr 127.0.0.1:17901 --metrics-addr 127.0.0.1:17811 --log warn &
lk=$!; pids+=("$lk")
wait_port 17801; sleep 1
"$TARGET/examples/lease_refresh_cpu" --endpoint 127.0.0.1:17801 --mode latchkey \
  --leases "$LEASES" --interval-secs "$INTERVAL" --duration-secs "$DURATION" --pid "$lk"
kill "$lk"

echo "== etcd $(etcd --version | head -1 | awk '{print $3}'), keep-alive stream"
etcd --data-dir "$work/etcd" --listen-client-urls http://127.0.0.1:12379 \
  --advertise-client-urls http://127.0.0.1:12379 --listen-peer-urls http://127.0.0.1:12380 \
  --initial-advertise-peer-urls http://127.0.0.1:12380 \
  --initial-cluster default=http://127.0.0.1:12380 --log-level warn >"$work/etcd.log" 2>&1 &
et=$!; pids+=("$et")
wait_port 12379; sleep 1
"$TARGET/examples/lease_refresh_cpu" --endpoint 127.0.0.1:12379 --mode etcd \
  --leases "$LEASES" --interval-secs "$INTERVAL" --duration-secs "$DURATION" --pid "$et"
