#!/usr/bin/env bash
# Installs what building and testing latchkey needs, only when missing.
# Each check looks for the exact thing the build loads or runs, never for
# something that merely resembles it:
#
#   libclang  the RocksDB bindings (bindgen, loading libclang at run time)
#             open libclang.so, libclang.so.N, libclang-N.so or
#             libclang-N.so.N. libclang-cpp.so.N is a different library
#             (Debian's libclang-cpp14 ships it alone) and does not count.
#   protoc    gRPC code generation: `protoc --version` must run.
#   g++, make the C++ toolchain that compiles RocksDB.
#   etcdctl   etcd's own client, used by the compatibility tests.
#   iptables  the partition tests (they need root).
#   curl      the proxy's README test runs the README's curl examples.
#
# LATCHKEY_LIBCLANG_DIRS (space-separated) replaces the directories searched
# for libclang; scripts/test-install-deps.sh uses it to show the check says
# "missing" where there is no libclang. LATCHKEY_INSTALL_DRY_RUN=1 prints
# the packages it would install and installs nothing.
set -euo pipefail

# Directories bindgen's loader (clang-sys) searches on Debian, plus
# LIBCLANG_PATH when the user points it somewhere.
libclang_dirs() {
  if [ -n "${LATCHKEY_LIBCLANG_DIRS:-}" ]; then
    echo "$LATCHKEY_LIBCLANG_DIRS"
    return
  fi
  local dirs="${LIBCLANG_PATH:-}"
  for d in /usr/lib/llvm-*/lib /usr/lib/x86_64-linux-gnu /usr/lib/aarch64-linux-gnu \
    /usr/lib /usr/local/lib /usr/lib64; do
    [ -d "$d" ] && dirs="$dirs $d"
  done
  echo "$dirs"
}

have_libclang() {
  local d f
  for d in $(libclang_dirs); do
    for f in "$d"/libclang.so "$d"/libclang.so.[0-9]* "$d"/libclang-[0-9]*.so \
      "$d"/libclang-[0-9]*.so.[0-9]*; do
      [ -e "$f" ] && return 0
    done
  done
  return 1
}

# A command counts only when it runs.
runs() { "$@" >/dev/null 2>&1; }

need=()
runs protoc --version || need+=(protobuf-compiler)
runs etcdctl version || need+=(etcd-client)
runs g++ --version || need+=(g++)
runs make --version || need+=(make)
# The partition tests drop a member's peer traffic with iptables.
runs iptables --version || need+=(iptables)
runs curl --version || need+=(curl)
have_libclang || need+=(libclang-dev)

if ! command -v cargo >/dev/null 2>&1; then
  echo "cargo is missing: install Rust (https://rustup.rs) and retry" >&2
  exit 1
fi

if [ ${#need[@]} -eq 0 ]; then
  exit 0
fi
if [ "${LATCHKEY_INSTALL_DRY_RUN:-0}" = 1 ]; then
  echo "would install: ${need[*]}"
  exit 0
fi

echo "installing: ${need[*]}" >&2
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null

# Check again what was just installed: a package that installs but does not
# provide what the build loads must fail here, not twenty minutes later.
have_libclang || { echo "libclang is still missing after installing libclang-dev" >&2; exit 1; }
runs protoc --version || { echo "protoc does not run" >&2; exit 1; }
runs etcdctl version || { echo "etcdctl does not run" >&2; exit 1; }

