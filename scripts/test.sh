#!/usr/bin/env bash
# The one command that runs every test: installs what is missing, checks
# formatting, then builds once (debug profile) and runs the script tests,
# the Helm chart checks, schemathesis against the HTTP API, short runs of
# the fuzz targets (fuzz/, built on their own), unit tests, integration
# tests and the etcd Go client compatibility suite
# (compat/etcd-go) against latchkey (plain and over TLS) and against etcd
# itself. Ends with a table of every stage's seconds (and every test
# binary's, and the slowest tests), pass or fail.
#
# Integration tests run one at a time: each starts real three-member cells,
# and their timing assertions (a new leader within 3 s, expiry within
# TTL + 1 s) are meant to measure the cell, not a starved 2-core machine.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/stages.sh
source scripts/stages.sh
# shellcheck source=scripts/compile-cache.sh
source scripts/compile-cache.sh
log=$(mktemp)
cache_line=""
# The table and the cache line are reports: they never change the status.
trap 'status=$?; stage_table || true; echo "$cache_line"; rm -f "$log"; exit "$status"' EXIT
# Output also goes to $log, for the closing count of tests.
logged() { "$@" 2>&1 | tee -a "$log"; }

stage "install-deps" scripts/install-deps.sh
# A debug build of the workspace and its tests takes about 7 GiB; short of
# that, the linker dies late and obscurely (a bus error, "No space left on
# device"), so say it at the start, with where the space went.
free_kib=$(df -Pk . | awk 'NR == 2 { print $4 }')
if [ "${free_kib:-0}" -lt $((10 * 1024 * 1024)) ]; then
  echo "warning: $((free_kib / 1024)) MiB free on the disk of $(pwd); the build needs about 7 GiB" >&2
  echo "         (the compile cache holds at most \$SCCACHE_CACHE_SIZE, default 10G, in ~/.cache/latchkey/sccache)" >&2
fi
compile_cache_on
# The fuzz targets are a workspace of their own (fuzz/).
stage "format check" cargo fmt --all -- --check
stage "format check, fuzz/" cargo fmt --manifest-path fuzz/Cargo.toml -- --check
stage "build" cargo build --workspace --all-targets
# Read now: sccache's server stops itself after 10 idle minutes, and its
# counts with it.
cache_line=$(compile_cache_stats)
stage "install-deps checks" logged scripts/test-install-deps.sh
# The Helm chart and the Dockerfile, offline (helm lint and template, the
# Kubernetes API schemas, hadolint: nothing deployed, nothing built), then
# the chart's start script against real latchkey-cell processes.
stage "helm" logged scripts/test-helm.sh
stage "cell start script" logged scripts/test-cell-start.sh "${CARGO_TARGET_DIR:-target}/debug"
stage "cell start script, TLS" logged scripts/test-cell-start.sh "${CARGO_TARGET_DIR:-target}/debug" --tls
# schemathesis against a live `latchkey-proxy --dev`: no 5xx, no response
# outside /v1/openapi.json.
stage "schemathesis" logged scripts/test-schemathesis.sh "${CARGO_TARGET_DIR:-target}/debug"
# Each fuzz target of fuzz/ for 20 s (the 10-minute runs are in
# docs/security.md): no panic, no hang, no 500.
stage "fuzz targets, 20 s each" logged scripts/fuzz.sh 20
stage "cargo test (all binaries)" logged timed_cargo_test "cargo test" --workspace -- --test-threads=1
# The official etcd Go client against a 3-member latchkey cell, and the
# same program against Debian's etcd 3.4 as the reference it must match.
stage "etcd Go client vs latchkey" logged scripts/test-etcd-compat.sh --latchkey "${CARGO_TARGET_DIR:-target}/debug/latchkey-cell"
# The same suite over TLS with client certificates required everywhere;
# TestTLS adds the proxy and a client without a certificate.
stage "etcd Go client vs latchkey, TLS" logged scripts/test-etcd-compat.sh --latchkey "${CARGO_TARGET_DIR:-target}/debug/latchkey-cell" --tls
# The same suite with authentication on, every client as root; TestAuth
# adds a user limited to one prefix and etcd's typed auth errors.
stage "etcd Go client vs latchkey, auth" logged scripts/test-etcd-compat.sh --latchkey "${CARGO_TARGET_DIR:-target}/debug/latchkey-cell" --auth
stage "etcd Go client vs etcd" logged scripts/test-etcd-compat.sh --etcd
# One closing line for the whole run (cargo prints one per test binary).
awk '/^test result:/ { p += $4; f += $6 } END { printf "tests: %d passed, %d failed\n", p, f }' "$log"
