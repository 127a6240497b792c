#!/usr/bin/env bash
# Checks that scripts/install-deps.sh decides "libclang is missing" exactly
# when bindgen could not load one: it must not be fooled by libclang-cpp
# (what Debian's libclang-cpp14 ships alone), and must accept each file name
# bindgen's loader opens. Runs install-deps.sh in dry-run mode against
# directories made here, so it installs nothing.
set -uo pipefail
cd "$(dirname "$0")/.."
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
passed=0
failed=0

# expect NAME FILES... -- WANT: WANT is "missing" or "present".
expect() {
  local name=$1 want=$2; shift 2
  local case="$dir/$name"
  mkdir -p "$case"
  for f in "$@"; do : >"$case/$f"; done
  local out
  out=$(LATCHKEY_LIBCLANG_DIRS="$case" LATCHKEY_INSTALL_DRY_RUN=1 bash scripts/install-deps.sh 2>&1)
  local got=present
  [[ "$out" == *libclang-dev* ]] && got=missing
  if [ "$got" = "$want" ]; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
    echo "install-deps: $name: libclang judged $got, expected $want (output: $out)" >&2
  fi
}

expect empty_directory missing
expect only_libclang_cpp missing libclang-cpp.so.14 libclangBasic.a
expect unversioned present libclang.so
expect versioned_soname present libclang-14.so.1
expect versioned_name present libclang-14.so
expect suffix_versioned present libclang.so.1

status=ok
[ "$failed" -eq 0 ] || status=FAILED
# The line cargo test prints, so scripts/test.sh counts these too.
echo "test result: $status. $passed passed; $failed failed; (scripts/test-install-deps.sh)"
[ "$failed" -eq 0 ]
