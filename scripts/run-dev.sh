#!/usr/bin/env bash
# Runs a one-member latchkey cell in ./latchkey-data on the default ports:
# etcd v3 gRPC on 127.0.0.1:7801, metrics/health on 127.0.0.1:7811.
#
# Builds exactly what scripts/test.sh builds (the whole workspace with its
# tests): a narrower `cargo run -p` resolves some dependencies' features
# differently and would compile RocksDB a second time.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cargo build --workspace --all-targets
exec "${CARGO_TARGET_DIR:-target}/debug/latchkey-cell" --dev "$@"
