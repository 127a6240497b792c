#!/usr/bin/env bash
# Runs a one-member latchkey cell in ./latchkey-data on the default ports:
# etcd v3 gRPC on 127.0.0.1:7801, metrics/health on 127.0.0.1:7811.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
exec cargo run -p latchkey-cell -- --dev "$@"
