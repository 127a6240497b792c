#!/usr/bin/env bash
# Watch fan-out through one proxy, and its read cache: builds latchkey-cell,
# latchkey-proxy and latchkey-bench-watch (release), starts a 3-member cell
# on 127.0.0.1 and, per --fanout-jitter value (default 0s and 100ms), one
# proxy with 100 000 gRPC watches of one key; writes the key 40 times and
# prints write-to-client delivery p50/p99/max, events missed (must be 0),
# the watches the cell serves (must be 1), the proxy's RSS and CPU. Then
# compares serializable reads/s through the proxy's cache with reads
# straight from a follower, same client. Everything it starts is gone when
# it exits.
#
#   scripts/bench-watch.sh                          # 100 000 watchers
#   scripts/bench-watch.sh --watchers 20000 --jitters 0s
#   scripts/bench-watch.sh --help                   # every option
#
# A benchmark, not a test: the test suite does not run it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cargo build --release -q -p latchkey-cell -p latchkey-proxy -p latchkey-bench
exec "${CARGO_TARGET_DIR:-target}/release/latchkey-bench-watch" "$@"
