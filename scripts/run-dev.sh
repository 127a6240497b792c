#!/usr/bin/env bash
# Runs latchkey for trying it out: `latchkey-proxy --dev`, a one-member cell
# (data in ./latchkey-data) inside the proxy's process, with the proxy on
# its default ports: HTTP/JSON on 127.0.0.1:7700, etcd v3 gRPC on
# 127.0.0.1:7701, /metrics on 127.0.0.1:7711. Extra arguments go to the
# proxy.
#
# Builds exactly what scripts/test.sh builds (the whole workspace with its
# tests): a narrower `cargo run -p` resolves some dependencies' features
# differently and would compile RocksDB a second time.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
# shellcheck source=scripts/compile-cache.sh
source scripts/compile-cache.sh
compile_cache_on
cargo build --workspace --all-targets
exec "${CARGO_TARGET_DIR:-target}/debug/latchkey-proxy" --dev "$@"
