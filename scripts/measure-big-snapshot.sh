#!/usr/bin/env bash
# Measures a follower catching up from a snapshot over 1 GiB (cell review
# A3): a 3-member cell on 127.0.0.1:241xx-243xx, member 3 killed, N puts of
# 1 MB through members 1 and 2 (N=1260 gives a snapshot of ~1.2 GB), then
# member 3 restarted; prints how long it took to hold every key and the
# snapshot it installed. Too slow for the test suite; run by hand:
#   cargo build -p latchkey-cell && scripts/measure-big-snapshot.sh [N]
# Generous Raft timings: openraft times AppendEntries out after one
# heartbeat (review P5), which 1 MB entries outlast on a debug build.
set -u
cd "$(dirname "$0")/.."
N=${1:-1260}
BIN=${LATCHKEY_CELL_BIN:-${CARGO_TARGET_DIR:-target}/debug/latchkey-cell}
W=$(mktemp -d)
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null; wait "${pids[@]}" 2>/dev/null; rm -rf "$W"; }
trap cleanup EXIT
IC="1=127.0.0.1:24101,2=127.0.0.1:24102,3=127.0.0.1:24103"
FLAGS=(--snapshot-entries 300 --snapshot-keep-entries 20 --max-value-bytes 1048576
  --max-request-bytes 2097152 --heartbeat-ms 2000 --election-timeout-ms 10000)
start() {
  "$BIN" --id "$1" --initial-cluster $IC --data-dir "$W/d$1" --client-addr "127.0.0.1:2420$1" \
    --peer-addr "127.0.0.1:2410$1" --metrics-addr "127.0.0.1:2430$1" "${FLAGS[@]}" >"$W/m$1.log" 2>&1 &
  pids[$1]=$!
}
for i in 1 2 3; do start $i; done
EP=127.0.0.1:24201,127.0.0.1:24202
for _ in $(seq 1 60); do etcdctl --endpoints=$EP put warm up >/dev/null 2>&1 && break; sleep 1; done
kill -9 "${pids[3]}"; wait "${pids[3]}" 2>/dev/null
head -c 1000000 /dev/zero | tr '\0' x >"$W/value"
t0=$(date +%s)
writer() {
  for i in $(seq "$1" 4 "$N"); do
    etcdctl --endpoints=$EP --command-timeout=30s put "big/$(printf %05d "$i")" <"$W/value" >/dev/null 2>&1 || echo "put $i failed"
  done
}
writers=(); for k in 1 2 3 4; do writer $k & writers+=($!); done; wait "${writers[@]}"
echo "wrote $N x 1 MB in $(( $(date +%s) - t0 )) s"
for _ in $(seq 1 120); do
  sleep 2
  last=$(sed 's/\x1b\[[0-9;]*m//g' "$W/m1.log" "$W/m2.log" | grep -o "snapshot built snapshot_id=[0-9-]* bytes=[0-9]*" | tail -1)
  [ -n "$last" ] && [ "${last##*bytes=}" -gt 1073741824 ] && break
done
echo "last snapshot: $last"
want=$(etcdctl --endpoints=$EP get big/ --prefix --keys-only 2>/dev/null | grep -c big/)
t1=$(date +%s); start 3
for _ in $(seq 1 900); do
  c=$(etcdctl --endpoints=127.0.0.1:24203 get big/ --prefix --keys-only --consistency=s 2>/dev/null | grep -c big/)
  [ "$c" = "$want" ] && break; sleep 2
done
echo "member 3 holds $c of $want keys $(( $(date +%s) - t1 )) s after it started"
curl -s 127.0.0.1:24303/metrics | grep -E "^latchkey_snapshot_installed_bytes|^latchkey_snapshots_installed_total"
echo "elections member 3 started: $(sed 's/\x1b\[[0-9;]*m//g' "$W/m3.log" | grep -c 'election timeout passed')"
