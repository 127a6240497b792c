#!/usr/bin/env bash
# Builds the fuzz targets of fuzz/ (cargo-fuzz, libFuzzer) and runs each
# for a while; fails when one crashes, panics, hangs or answers 500.
#
#   scripts/fuzz.sh SECONDS [TARGET...]     # default: every target
#
# Each target starts from the seeds in fuzz/seeds/TARGET (when there are
# any) and its corpus in $LATCHKEY_FUZZ_CORPUS/TARGET (default
# ~/.cache/latchkey/fuzz-corpus), which keeps what earlier runs on this
# machine found; an empty or missing one only means less to start from.
# A crash's input is written to $LATCHKEY_FUZZ_ARTIFACTS (default
# ./fuzz-artifacts, ignored by git); replay it with
# `fuzz/target/x86_64-unknown-linux-gnu/release/TARGET FILE`.
#
# Targets run one after another (each may use both cores: the live ones
# run a cell and a proxy in the fuzzing process). Built with libFuzzer's
# coverage and no sanitizer: the code under test forbids `unsafe`, so a
# sanitizer's cost (half the speed or worse, a nightly compiler) buys
# little; debug assertions and overflow checks are on.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/tools.sh
source scripts/tools.sh
# shellcheck source=scripts/compile-cache.sh
source scripts/compile-cache.sh
seconds=${1:?usage: scripts/fuzz.sh SECONDS [TARGET...]}
shift
cargo_fuzz_is_pinned || { echo "cargo-fuzz $CARGO_FUZZ_VERSION is missing: run scripts/install-deps.sh" >&2; exit 2; }
targets=("$@")
if [ ${#targets[@]} = 0 ]; then
  mapfile -t targets < <(cd fuzz && cargo fuzz list)
fi
corpus_root=${LATCHKEY_FUZZ_CORPUS:-$HOME/.cache/latchkey/fuzz-corpus}
artifacts=$(realpath -m "${LATCHKEY_FUZZ_ARTIFACTS:-fuzz-artifacts}")
mkdir -p "$artifacts"

compile_cache_on
(cd fuzz && cargo fuzz build --sanitizer none --release --debug-assertions 2>&1 | tail -3) ||
  { echo "building the fuzz targets failed" >&2; exit 1; }
compile_cache_stats
bin=fuzz/target/x86_64-unknown-linux-gnu/release

failed=()
scratch=""
trap '[ -z "$scratch" ] || rm -rf "$scratch"' EXIT
for target in "${targets[@]}"; do
  corpus=$corpus_root/$target
  mkdir -p "$corpus"
  seeds=()
  [ -d "fuzz/seeds/$target" ] && seeds=("fuzz/seeds/$target")
  log=$(mktemp)
  # The target's temp files (the live targets' cell data, snapshot files)
  # go to a scratch directory, on tmpfs where there is one, removed after
  # the run: the process itself never removes them (they live for the
  # whole process, which a crash aborts).
  scratch=$(mktemp -d -p /dev/shm latchkey-fuzz.XXXXXX 2>/dev/null || mktemp -d)
  set +e
  # -timeout: one input taking 60 s is a hang (the live targets' longest
  # wait is a second). -rss_limit_mb: a leak or an allocation a hostile
  # length asked for.
  TMPDIR=$scratch "$bin/$target" "$corpus" "${seeds[@]}" -max_total_time="$seconds" -timeout=60 \
    -rss_limit_mb=4096 -artifact_prefix="$artifacts/$target-" -print_final_stats=1 >"$log" 2>&1
  rc=$?
  set -e
  rm -rf "$scratch"
  scratch=""
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
  cov=$(grep -E '^#[0-9]+' "$log" | tail -1 | grep -oE 'cov: [0-9]+' || true)
  size=$(find "$corpus" -type f | wc -l)
  bytes=$(du -sk --apparent-size "$corpus" | cut -f1)
  if [ "$rc" = 0 ]; then
    echo "fuzz $target: ${seconds} s, ${runs:-?} inputs, ${cov:-cov: ?}, corpus $size inputs ($bytes KiB), no crash"
  else
    grep -E 'panicked|ERROR: libFuzzer|SUMMARY|Test unit written' -A3 "$log" | head -40
    echo "fuzz $target: FAILED (exit $rc) after ${runs:-?} inputs; the input is in $artifacts"
    failed+=("$target")
  fi
  rm -f "$log"
done
if [ ${#failed[@]} = 0 ]; then
  echo "test result: ok. ${#targets[@]} fuzz targets ran ${seconds} s each without a crash; (scripts/fuzz.sh)"
else
  echo "test result: FAILED. fuzz targets that crashed: ${failed[*]}; (scripts/fuzz.sh)"
  exit 1
fi
