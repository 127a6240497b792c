#!/usr/bin/env bash
# latchkey next to etcd on this machine: builds latchkey-cell and
# latchkey-bench (release), then starts a 3-member etcd (Debian's
# etcd-server) and a 3-member latchkey cell on 127.0.0.1 and runs the same
# workloads with the same Rust client against one and then the other,
# workload by workload. Prints one JSON line per workload and target, then
# a table of latchkey/etcd ratios. Everything it starts is gone when it
# exits.
#
#   scripts/bench-vs-etcd.sh                         # every workload, defaults
#   scripts/bench-vs-etcd.sh --workloads put,txn-cas --duration 20
#   scripts/bench-vs-etcd.sh --help                  # every option
#
# A benchmark, not a test: the test suite does not run it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
if ! command -v etcd >/dev/null 2>&1; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  echo "installing etcd-server" >&2
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq etcd-server >/dev/null 2>&1 ||
    { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq etcd-server >/dev/null; }
fi
cargo build --release -q -p latchkey-cell -p latchkey-bench
exec "${CARGO_TARGET_DIR:-target}/release/latchkey-bench" "$@"
