# Sourced by scripts/test.sh: where the test command's time goes.
#
#   stage NAME CMD...     runs CMD and records NAME, its seconds and its exit
#                         status; returns that status.
#   timed_cargo_test NAME ARGS...
#                         `cargo test ARGS`, recording one row per test binary
#                         it runs (NAME: crate, target) and every test's
#                         seconds (for the slowest tests); output passes
#                         through unchanged.
#   stage_table           prints the rows, the total and the slowest tests.
#                         test.sh calls it on exit, so a failed run prints it
#                         too, up to the stage that failed.
#
# Times come from bash's EPOCHREALTIME, in microseconds.
STAGE_DIR=$(mktemp -d)
STAGE_START=${EPOCHREALTIME/./}

now_us() { echo "${EPOCHREALTIME/./}"; }

# seconds_since START_US: elapsed seconds with one decimal.
seconds_since() {
  local d=$(($(now_us) - $1))
  printf '%d.%d' $((d / 1000000)) $((d / 100000 % 10))
}

stage_row() { printf '%s\t%s\t%s\n' "$1" "$2" "$3" >>"$STAGE_DIR/rows"; }

stage() {
  local name=$1 t0 rc=0
  shift
  t0=$(now_us)
  echo "==> stage: $name" >&2
  "$@" || rc=$?
  stage_row "$name" "$(seconds_since "$t0")" "$rc"
  return "$rc"
}

# Reads cargo test's output: passes every line through, and notes when each
# test binary starts ("Running ... (target/debug/deps/NAME-HASH)") and each
# test's result line ("test x ... ok"; with --test-threads=1 a test's line
# ends when it does, so the time since the previous line is its time).
time_test_binaries() {
  local prefix=$1 line cur="" t0=0 last now result="" re_run re_test
  re_run='^[[:space:]]+(Running|Doc-tests) (.*)$'
  re_test='^test (.+) \.\.\. (ok|FAILED|ignored)'
  last=$(now_us)
  while IFS= read -r line; do
    printf '%s\n' "$line"
    now=$(now_us)
    if [[ $line =~ $re_run ]]; then
      [ -z "$cur" ] || stage_row "$cur" "$(seconds_since "$t0")" "${result:-?}"
      cur="$prefix: $(binary_name "${BASH_REMATCH[2]}")" t0=$now result=""
    elif [[ $line =~ $re_test ]]; then
      printf '%d\t%s\n' $((now - last)) "${BASH_REMATCH[1]}" >>"$STAGE_DIR/tests"
    elif [[ $line == "test result: ok."* ]]; then
      result=0
    elif [[ $line == "test result: FAILED."* ]]; then
      result=1
    fi
    last=$now
  done
  [ -z "$cur" ] || stage_row "$cur" "$(seconds_since "$t0")" "${result:-?}"
}

# "unittests src/lib.rs (target/debug/deps/latchkey_cell-0a1b)" ->
# "latchkey_cell src/lib.rs"; "tests/cluster/main.rs (.../cluster-0a1b)" ->
# "cluster tests/cluster/main.rs".
binary_name() {
  local what=$1 src bin
  src=${what%% (*}
  src=${src#unittests }
  bin=${what##*/}
  bin=${bin%)}
  bin=${bin%-*}
  if [ "$bin" = "$what" ]; then echo "$what"; else echo "$bin $src"; fi
}

timed_cargo_test() {
  local name=$1
  shift
  cargo test "$@" 2>&1 | time_test_binaries "$name"
}

stage_table() {
  local rows="$STAGE_DIR/rows"
  echo
  echo "== where the time went (seconds; status 0 = passed)"
  if [ -s "$rows" ]; then
    awk -F'\t' '{ printf "%8s  %-6s %s\n", $2, $3, $1 }' "$rows"
  fi
  printf '%8s  %-6s %s\n' "$(seconds_since "$STAGE_START")" "" "whole run"
  if [ -s "$STAGE_DIR/tests" ]; then
    echo "== slowest tests (seconds)"
    # awk reads to the end: `head` would close the pipe early, and under
    # pipefail sort's SIGPIPE (141) became the run's exit status once the
    # list outgrew the pipe's buffer (run M, 395 tests).
    sort -rn "$STAGE_DIR/tests" |
      awk -F'\t' 'NR <= 20 { printf "%8.1f  %s\n", $1 / 1000000, $2 }'
  fi
  rm -rf "$STAGE_DIR"
}
