#!/usr/bin/env bash
# Sessions through one proxy: builds latchkey-cell, latchkey-proxy and
# latchkey-bench-sessions (release), starts a 3-member cell and one proxy on
# 127.0.0.1, creates 100 000 sessions (half over HTTP, half over gRPC) and
# keeps them alive for 60 s, each every third of its TTL. Prints one JSON
# line and a table: spurious expiries (must be 0), client keep-alives/s,
# keep-alive p50/p99, the cell's refresh batches/s, the proxy's CPU and RSS,
# the cell leader's CPU. Everything it starts is gone when it exits.
#
#   scripts/bench-sessions.sh                       # 100 000 sessions, 60 s
#   scripts/bench-sessions.sh --sessions 20000 --duration 30
#   scripts/bench-sessions.sh --help                # every option
#
# A benchmark, not a test: the test suite does not run it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cargo build --release -q -p latchkey-cell -p latchkey-proxy -p latchkey-bench
exec "${CARGO_TARGET_DIR:-target}/release/latchkey-bench-sessions" "$@"
