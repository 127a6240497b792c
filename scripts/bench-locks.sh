#!/usr/bin/env bash
# Lock throughput and latency: builds latchkey-cell, latchkey-proxy and
# latchkey-bench-locks (release), then runs 16 etcd clients locking and
# unlocking (etcd's v3lockpb.Lock) on 1 lock and on 16 locks, through a
# latchkey proxy, straight to a latchkey cell member, and against a
# 3-member etcd 3.4 (Debian's etcd-server) for reference. Prints one JSON
# line and a table: acquisitions/s, p50/p99 latency, errors. Everything it
# starts is gone when it exits.
#
#   scripts/bench-locks.sh                          # 16 clients, 10 s per run
#   scripts/bench-locks.sh --seconds 30 --latchkey-only
#   scripts/bench-locks.sh --pick random             # each acquisition a random lock
#   scripts/bench-locks.sh --help                   # every option
#
# A benchmark, not a test: the test suite does not run it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cargo build --release -q -p latchkey-cell -p latchkey-proxy -p latchkey-bench
exec "${CARGO_TARGET_DIR:-target}/release/latchkey-bench-locks" "$@"
