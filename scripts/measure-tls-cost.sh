#!/usr/bin/env bash
# Measures what TLS costs: the load test's `kv` scenario straight to a
# 3-member latchkey cell and to a 3-member etcd 3.4, and its `sessions`
# scenario through two proxies in front of each (latchkey-proxy; etcd's own
# `etcd grpc-proxy`), each plain and with TLS (client certificates
# required, mutual TLS between members and from the proxies to the
# members), in alternating rounds on this machine; prints two tables. Too
# slow for the test suite; run by hand on release builds:
#
#   cargo build --release -p latchkey-cell -p latchkey-proxy -p latchkey-loadtest
#   scripts/measure-tls-cost.sh [ROUNDS] [DURATION]     # default 2 rounds of 10s
#
# Certificates from scripts/make-certs.sh (ECDSA P-256). kv loads: puts
# (--writes 1) and linearizable gets (--writes 0), 64 clients on 8
# connections, 1 000 keys of 256 bytes. sessions: 20 000 leases of TTL
# 30 s on gRPC keep-alive streams (8 per proxy), each refreshed every
# 10 s (as `compare` runs it: a count and rate etcd holds). LATCHKEY_BIN_DIR (default target/release) holds latchkey-cell,
# latchkey-proxy and latchkey-loadtest.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-2}
duration=${2:-10s}
bin=${LATCHKEY_BIN_DIR:-${CARGO_TARGET_DIR:-target}/release}
for b in latchkey-cell latchkey-proxy latchkey-loadtest; do
  [ -x "$bin/$b" ] || { echo "no $bin/$b: cargo build --release -p $b" >&2; exit 2; }
done
command -v etcd >/dev/null || { echo "etcd is missing: scripts/install-deps.sh installs it" >&2; exit 2; }
work=$(mktemp -d)
pids=()
stop() {
  local p
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  pids=()
}
trap 'stop; rm -rf "$work"' EXIT
certs=$work/certs
scripts/make-certs.sh "$certs" member=IP:127.0.0.1 proxy=IP:127.0.0.1 client=DNS:loadtest \
  --no-cn etcd-proxy=IP:127.0.0.1 >/dev/null
C=$certs
results=$work/results.jsonl

# start SYSTEM MODE: a fresh 3-member cluster on 127.0.0.1:2510x-2530x.
start() {
  local system=$1 mode=$2 i s=http
  [ "$mode" = plain ] || s=https
  rm -rf "$work/data"
  local cluster=""
  for i in 1 2 3; do
    if [ "$system" = latchkey ]; then cluster="$cluster${cluster:+,}$i=127.0.0.1:2520$i"
    else cluster="$cluster${cluster:+,}m$i=$s://127.0.0.1:2520$i"; fi
  done
  for i in 1 2 3; do
    if [ "$system" = latchkey ]; then
      local tls=()
      [ "$mode" = plain ] || tls=(--cert-file "$C/member.pem" --key-file "$C/member-key.pem"
        --trusted-ca-file "$C/ca.pem" --client-cert-auth --peer-cert-file "$C/member.pem"
        --peer-key-file "$C/member-key.pem" --peer-trusted-ca-file "$C/ca.pem")
      [ -f "$work/proxy.key" ] ||
        (umask 077; head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$work/proxy.key")
      "$bin/latchkey-cell" --id "$i" --data-dir "$work/data/$i" --initial-cluster "$cluster" \
        --proxy-key-file "$work/proxy.key" \
        --client-addr "127.0.0.1:2510$i" --peer-addr "127.0.0.1:2520$i" \
        --metrics-addr "127.0.0.1:2530$i" ${tls[@]+"${tls[@]}"} --log warn >"$work/m$i.log" 2>&1 &
    else
      local tls=()
      [ "$mode" = plain ] || tls=(--cert-file "$C/member.pem" --key-file "$C/member-key.pem"
        --trusted-ca-file "$C/ca.pem" --client-cert-auth --peer-cert-file "$C/member.pem"
        --peer-key-file "$C/member-key.pem" --peer-trusted-ca-file "$C/ca.pem" --peer-client-cert-auth)
      etcd --name "m$i" --data-dir "$work/data/$i" \
        --listen-client-urls "$s://127.0.0.1:2510$i" --advertise-client-urls "$s://127.0.0.1:2510$i" \
        --listen-peer-urls "$s://127.0.0.1:2520$i" --initial-advertise-peer-urls "$s://127.0.0.1:2520$i" \
        --initial-cluster "$cluster" --initial-cluster-state new --initial-cluster-token "tls-$$" \
        ${tls[@]+"${tls[@]}"} --log-level warn --logger zap >"$work/m$i.log" 2>&1 &
    fi
    pids+=($!)
  done
  local ctl=(etcdctl --endpoints="$s://127.0.0.1:25101" --dial-timeout=2s --command-timeout=3s)
  [ "$mode" = plain ] || ctl+=(--cacert "$C/ca.pem" --cert "$C/client.pem" --key "$C/client-key.pem")
  for _ in $(seq 120); do "${ctl[@]}" put warm up >/dev/null 2>&1 && return 0; sleep 0.5; done
  echo "$system $mode did not start" >&2; tail -n 5 "$work"/m*.log >&2; exit 1
}

# load SYSTEM MODE WRITES
load() {
  local tls=()
  [ "$2" = plain ] || tls=(--tls-cacert "$C/ca.pem" --tls-cert "$C/client.pem" --tls-key "$C/client-key.pem")
  "$bin/latchkey-loadtest" kv --target "$1" --cells 127.0.0.1:25101,127.0.0.1:25102,127.0.0.1:25103 \
    --writes "$3" --duration "$duration" --out "$work/one.jsonl" ${tls[@]+"${tls[@]}"} >/dev/null
  python3 - "$1" "$2" "$3" "$work/one.jsonl" >>"$results" <<'PY'
import json, sys
system, mode, writes, path = sys.argv[1:]
line = json.loads(open(path).read().splitlines()[-1])
p99 = line["latency_p99_ms"]
print(json.dumps({"system": system, "mode": mode, "load": "put" if writes == "1" else "get", "ops": line["ops_per_s"], "p99": p99}))
PY
}

# start_proxies SYSTEM MODE: two proxies in front of the members, gRPC
# on 127.0.0.1:2570x (latchkey's metrics on 2580x, HTTP on 2560x).
start_proxies() {
  local system=$1 mode=$2 i s=http members=""
  [ "$mode" = plain ] || s=https
  for i in 1 2 3; do members="$members${members:+,}$s://127.0.0.1:2510$i"; done
  for i in 1 2; do
    local tls=()
    if [ "$system" = latchkey ]; then
      [ "$mode" = plain ] || tls=(--cert-file "$C/proxy.pem" --key-file "$C/proxy-key.pem"
        --trusted-ca-file "$C/ca.pem" --client-cert-auth
        --cacert "$C/ca.pem" --cert "$C/proxy.pem" --key "$C/proxy-key.pem")
      "$bin/latchkey-proxy" --cells "$members" --http-addr "127.0.0.1:2560$i" \
        --proxy-key-file "$work/proxy.key" \
        --grpc-addr "127.0.0.1:2570$i" --metrics-addr "127.0.0.1:2580$i" \
        ${tls[@]+"${tls[@]}"} --log warn >"$work/p$i.log" 2>&1 &
    else
      [ "$mode" = plain ] || tls=(--cert-file "$C/proxy.pem" --key-file "$C/proxy-key.pem"
        --trusted-ca-file "$C/ca.pem" --cacert "$C/ca.pem" --cert "$C/etcd-proxy.pem"
        --key "$C/etcd-proxy-key.pem")
      etcd grpc-proxy start --endpoints "$members" --listen-addr "127.0.0.1:2570$i" \
        --advertise-client-url "127.0.0.1:2570$i" --data-dir "$work/data/p$i" \
        ${tls[@]+"${tls[@]}"} >"$work/p$i.log" 2>&1 &
    fi
    pids+=($!)
  done
  for i in 1 2; do
    local ctl=(etcdctl --endpoints="$s://127.0.0.1:2570$i" --dial-timeout=2s --command-timeout=3s)
    [ "$mode" = plain ] || ctl+=(--cacert "$C/ca.pem" --cert "$C/client.pem" --key "$C/client-key.pem")
    local ok=0
    for _ in $(seq 120); do "${ctl[@]}" put warm up >/dev/null 2>&1 && { ok=1; break; }; sleep 0.5; done
    [ "$ok" = 1 ] || { echo "$system $mode proxy $i did not start" >&2; tail -n 5 "$work"/p*.log >&2; exit 1; }
  done
}

# sessions SYSTEM MODE
sessions() {
  local tls=() metrics=()
  [ "$2" = plain ] || tls=(--tls-cacert "$C/ca.pem" --tls-cert "$C/client.pem" --tls-key "$C/client-key.pem")
  [ "$1" = etcd ] || metrics=(--cell-metrics 127.0.0.1:25301,127.0.0.1:25302,127.0.0.1:25303
    --proxy-metrics 127.0.0.1:25801,127.0.0.1:25802)
  "$bin/latchkey-loadtest" sessions --target "$1" --api grpc --sessions 20000 --ttl 30 \
    --grpc 127.0.0.1:25701,127.0.0.1:25702 --cells 127.0.0.1:25101,127.0.0.1:25102,127.0.0.1:25103 \
    ${metrics[@]+"${metrics[@]}"} --duration "$duration" --out "$work/one.jsonl" ${tls[@]+"${tls[@]}"} >/dev/null
  python3 - "$1" "$2" "$work/one.jsonl" >>"$results" <<'PY'
import json, sys
system, mode, path = sys.argv[1:]
line = json.loads(open(path).read().splitlines()[-1])
print(json.dumps({"system": system, "mode": mode, "load": "sessions", "ops": line["keepalives_per_s"],
                  "p99": line["keepalive_p99_ms"], "expired": line["spurious_expiries"],
                  "errors": line.get("errors", 0)}))
PY
}

for r in $(seq "$rounds"); do
  for system in latchkey etcd; do
    for mode in plain tls; do
      start "$system" "$mode"
      load "$system" "$mode" 1
      load "$system" "$mode" 0
      start_proxies "$system" "$mode"
      sessions "$system" "$mode"
      stop
      echo "round $r: $system $mode done" >&2
    done
  done
done
python3 - "$results" <<'PY'
import json, sys, statistics
rows = [json.loads(l) for l in open(sys.argv[1])]
def pick(system, mode, load, key):
    return [r[key] for r in rows if (r["system"], r["mode"], r["load"]) == (system, mode, load)]
print("| load | system | plain ops/s | TLS ops/s | TLS/plain | plain p99 ms | TLS p99 ms |")
print("|---|---|---|---|---|---|---|")
for load in ("put", "get"):
    for system in ("latchkey", "etcd"):
        p, t = pick(system, "plain", load, "ops"), pick(system, "tls", load, "ops")
        pp, tp = pick(system, "plain", load, "p99"), pick(system, "tls", load, "p99")
        print(f"| {load} | {system} | {', '.join(f'{x:.0f}' for x in p)} | {', '.join(f'{x:.0f}' for x in t)} "
              f"| {statistics.mean(t) / statistics.mean(p):.2f} | {statistics.mean(pp):.2f} | {statistics.mean(tp):.2f} |")
print()
print("| sessions through 2 proxies | plain keep-alives/s | TLS keep-alives/s | TLS/plain | plain p99 ms | TLS p99 ms | spurious expiries | errors |")
print("|---|---|---|---|---|---|---|---|")
for system in ("latchkey", "etcd"):
    p, t = pick(system, "plain", "sessions", "ops"), pick(system, "tls", "sessions", "ops")
    pp, tp = pick(system, "plain", "sessions", "p99"), pick(system, "tls", "sessions", "p99")
    exp = sum(pick(system, "plain", "sessions", "expired") + pick(system, "tls", "sessions", "expired"))
    err = sum(pick(system, "plain", "sessions", "errors") + pick(system, "tls", "sessions", "errors"))
    print(f"| {system} | {', '.join(f'{x:.0f}' for x in p)} | {', '.join(f'{x:.0f}' for x in t)} "
          f"| {statistics.mean(t) / statistics.mean(p):.2f} | {statistics.mean(pp):.2f} | {statistics.mean(tp):.2f} | {exp} | {err} |")
PY
