#!/usr/bin/env bash
# The one command that runs every test: installs what is missing, checks
# formatting, then builds once (debug profile) and runs the script tests,
# the Helm chart checks, unit tests, integration tests and the etcd Go
# client compatibility suite (compat/etcd-go) against latchkey and against
# etcd itself.
#
# Integration tests run one at a time: each starts real three-member cells,
# and their timing assertions (a new leader within 3 s, expiry within
# TTL + 1 s) are meant to measure the cell, not a starved 2-core machine.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cargo fmt --all -- --check
cargo build --workspace --all-targets
# The chaos variants of the cell and the proxy (crash points, test-only
# defects) for the safety suite, loadtest/tests/chaos.rs.
scripts/build-chaos.sh
log=$(mktemp)
trap 'rm -f "$log"' EXIT
scripts/test-install-deps.sh 2>&1 | tee "$log"
# The Helm chart and the Dockerfile, offline (helm lint and template, the
# Kubernetes API schemas, hadolint: nothing deployed, nothing built), then
# the chart's start script against real latchkey-cell processes.
scripts/test-helm.sh 2>&1 | tee -a "$log"
scripts/test-cell-start.sh "${CARGO_TARGET_DIR:-target}/debug" 2>&1 | tee -a "$log"
cargo test --workspace -- --test-threads=1 2>&1 | tee -a "$log"
# The official etcd Go client against a 3-member latchkey cell, and the
# same program against Debian's etcd 3.4 as the reference it must match.
scripts/test-etcd-compat.sh --latchkey "${CARGO_TARGET_DIR:-target}/debug/latchkey-cell" 2>&1 | tee -a "$log"
scripts/test-etcd-compat.sh --etcd 2>&1 | tee -a "$log"
# One closing line for the whole run (cargo prints one per test binary).
awk '/^test result:/ { p += $4; f += $6 } END { printf "tests: %d passed, %d failed\n", p, f }' "$log"
