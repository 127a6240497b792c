#!/usr/bin/env bash
# The one command that runs every test: installs what is missing, then
# builds once (debug profile) and runs unit and integration tests.
#
# Integration tests run one at a time: each starts real three-member cells,
# and their timing assertions (a new leader within 3 s, expiry within
# TTL + 1 s) are meant to measure the cell, not a starved 2-core machine.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cargo build --workspace --all-targets
cargo test --workspace -- --test-threads=1
