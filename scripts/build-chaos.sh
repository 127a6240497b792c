#!/usr/bin/env bash
# Builds the chaos variants of the cell and the proxy (`--features chaos`:
# crash points at the persist steps and the test-only defects the safety
# suite must catch) as latchkey-cell-chaos and latchkey-proxy-chaos beside
# the normal binaries, and leaves the normal binaries as they were. Only
# the latchkey crates are compiled again; RocksDB is not.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${CARGO_TARGET_DIR:-target}/debug"
cargo build -p latchkey-cell -p latchkey-proxy --features latchkey-cell/chaos,latchkey-proxy/chaos
cp "$out/latchkey-cell" "$out/latchkey-cell-chaos"
cp "$out/latchkey-proxy" "$out/latchkey-proxy-chaos"
cargo build -p latchkey-cell -p latchkey-proxy
