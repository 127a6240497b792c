#!/usr/bin/env bash
# Checks helm/latchkey and the Dockerfile with the real tools, offline:
#
#   helm lint --strict       the default values and values-production.yaml,
#                            each also with two more cells (`cells`)
#   helm template            defaults, cell.replicas=5, production,
#                            3 voters + 2 learners with every option on,
#                            and two more cells (b: 3 voters and two
#                            prefixes, c: 5) on the defaults and on
#                            production (c with 2 learners there)
#   kubernetes-validate      each render against the Kubernetes 1.27 (the
#                            chart's oldest) and 1.37 API schemas, strict
#   values.schema.json       rejects cell.replicas=4 (even), =three (a
#                            string) and an unknown key; a bad cell name,
#                            an even cell replicas and an unknown key in a
#                            cell. The templates refuse a cell named home,
#                            a cell listed twice, overlapping prefixes and
#                            cells without proxies
#   chart_checks.py          assertions on the rendered objects (replicas,
#                            --initial-cluster of DNS names, advertised
#                            addresses, PDB = quorum, probes,
#                            securityContext, alerts' metric names, every
#                            cell's objects, the directory Job's script
#                            run against a stub curl, the home cell's
#                            objects unchanged by `cells`, ...)
#   ShellCheck               the cell's start script
#   hadolint, dockerfile_checks.py   the Dockerfile (nothing is built)
#
# scripts/install-deps.sh installs the tools (scripts/tools.sh pins
# them). Prints one line per check, cargo's "test result:" line (so
# scripts/test.sh counts these), then "helm: N passed, M failed"; exits
# non-zero if any failed.
set -uo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/tools.sh
source scripts/tools.sh
export PATH="$GO_BIN_DIR:$LATCHKEY_TOOLS_VENV/bin:$PATH"
for tool in helm kubernetes-validate hadolint shellcheck; do
  command -v "$tool" >/dev/null || { echo "$tool is missing: run scripts/install-deps.sh" >&2; exit 1; }
done
py=$LATCHKEY_TOOLS_VENV/bin/python

chart=helm/latchkey
# The oldest Kubernetes the chart supports (Chart.yaml kubeVersion) and the
# newest the bundled schemas know.
kube_versions=(1.27.0 1.37.0)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
passed=0
failed=0

# check NAME COMMAND...: one line, the command's output only on failure.
check() {
  local name=$1; shift
  if "$@" >"$out/last.log" 2>&1; then
    passed=$((passed + 1)); echo "ok   helm: $name"
  else
    failed=$((failed + 1)); echo "FAIL helm: $name"
    sed 's/^/     /' "$out/last.log" | tail -n 20
  fi
}

# Counts the lines of a checker that prints its own "ok/FAIL helm:" lines.
tally() {
  local line status=0
  "$@" >"$out/tally.log" 2>&1 || status=$?
  cat "$out/tally.log"
  passed=$((passed + $(grep -c '^ok   helm:' "$out/tally.log")))
  failed=$((failed + $(grep -c '^FAIL helm:' "$out/tally.log")))
  if [ "$status" -ne 0 ] && ! grep -q '^FAIL helm:' "$out/tally.log"; then
    failed=$((failed + 1)); echo "FAIL helm: $* exited $status"
  fi
}

render() { helm template t "$chart" --namespace default --kube-version "${kube_versions[0]}" "$@"; }

# rejected NAME PATTERN ARGS...: rendering with ARGS fails, naming PATTERN.
rejected() {
  local pattern=$1; shift
  if render "$@" >/dev/null 2>"$out/err"; then
    echo "rendered with $*"; return 1
  fi
  grep -q "$pattern" "$out/err" || { cat "$out/err"; return 1; }
}

validates() {
  local v status=0
  for v in "${kube_versions[@]}"; do
    kubernetes-validate --strict --quiet --no-warn -k "$v" "$1" || status=1
  done
  return "$status"
}

check "lint --strict, default values" helm lint --strict "$chart" --kube-version "${kube_versions[0]}"
check "lint --strict, values-production.yaml" \
  helm lint --strict "$chart" -f "$chart/values-production.yaml" --kube-version "${kube_versions[0]}"

# Two more cells behind the proxies (values.yaml: cells); on production,
# c has two learners too and clients reach the proxies by label only.
cat >"$out/cells-values.yaml" <<'EOF'
cells:
  - name: b
    replicas: 3
    prefixes: ["jobs/", "queues/"]
  - name: c
    replicas: 5
EOF
cat >"$out/cells-production-values.yaml" <<'EOF'
cells:
  - name: b
    replicas: 3
    prefixes: ["jobs/", "queues/"]
  - name: c
    replicas: 5
    learners: 2
networkPolicy:
  allowExternal: false
EOF
check "lint --strict, two more cells" \
  helm lint --strict "$chart" -f "$out/cells-values.yaml" --kube-version "${kube_versions[0]}"
check "lint --strict, values-production.yaml and two more cells" \
  helm lint --strict "$chart" -f "$chart/values-production.yaml" -f "$out/cells-production-values.yaml" \
  --kube-version "${kube_versions[0]}"

check "template, default values (3 voters)" eval 'render >"$out/default.yaml"'
check "template, cell.replicas=5" eval 'render --set cell.replicas=5 >"$out/five.yaml"'
check "template, values-production.yaml" eval 'render -f "$chart/values-production.yaml" >"$out/production.yaml"'
check "template, 2 learners, no proxies, restore and backup upload" eval 'render \
  --set cell.learners=2 --set proxy.enabled=false \
  --set cell.restore.file=cell.snap --set cell.restore.persistentVolumeClaim=snaps \
  --set backup.enabled=true --set backup.upload.enabled=true --set backup.upload.url=s3://bucket/latchkey \
  --set backup.upload.image=example.org/uploader:1.0 --set-json "backup.upload.command=[\"sh\",\"-c\",\"true\"]" \
  >"$out/learners.yaml"'

check "template, two more cells (b: 3 voters, c: 5)" eval 'render -f "$out/cells-values.yaml" >"$out/cells.yaml"'
check "template, values-production.yaml and two more cells" \
  eval 'render -f "$chart/values-production.yaml" -f "$out/cells-production-values.yaml" >"$out/cells-production.yaml"'

for r in default five production learners cells cells-production; do
  check "$r render validates against the Kubernetes ${kube_versions[*]} schemas" validates "$out/$r.yaml"
done

check "schema rejects cell.replicas=4 (even)" rejected "/cell/replicas" --set cell.replicas=4
check "schema rejects cell.replicas=2 (even)" rejected "/cell/replicas" --set cell.replicas=2
check "schema rejects cell.replicas=three (not an integer)" rejected "/cell/replicas.*want integer" --set cell.replicas=three
check "schema rejects an unknown key" rejected "additional properties 'replica' not allowed" --set cell.replica=3
check "schema rejects a cell name with capitals or '_'" rejected "/cells/0/name.*does not match pattern" \
  --set-json 'cells=[{"name":"Cell_B"}]'
check "schema rejects an even cell replicas (4)" rejected "/cells/0/replicas" \
  --set-json 'cells=[{"name":"b","replicas":4}]'
check "schema rejects an unknown key in a cell" rejected "/cells/0.*additional properties 'replica' not allowed" \
  --set-json 'cells=[{"name":"b","replica":3}]'
check "chart refuses a cell named home (the home cell's name in the directory)" \
  rejected 'cells: "home" is not a cell name' --set-json 'cells=[{"name":"home"}]'
check "chart refuses a cell listed twice" rejected 'cells: "b" is listed twice' \
  --set-json 'cells=[{"name":"b"},{"name":"b"}]'
check "chart refuses overlapping prefixes" rejected 'prefix "jobs/1/" (cell c) and prefix "jobs/" (cell b) overlap' \
  --set-json 'cells=[{"name":"b","prefixes":["jobs/"]},{"name":"c","prefixes":["jobs/1/"]}]'
check "chart refuses cells without proxies" rejected "cells needs proxy.enabled" \
  --set-json 'cells=[{"name":"b"}]' --set proxy.enabled=false

tally "$py" scripts/chart_checks.py "$out"

check "shellcheck: the cell's start script" shellcheck -s sh "$chart/files/cell-start.sh"
check "hadolint: Dockerfile" hadolint Dockerfile
tally "$py" scripts/dockerfile_checks.py

status=ok
[ "$failed" -eq 0 ] || status=FAILED
echo "test result: $status. $passed passed; $failed failed; (scripts/test-helm.sh)"
echo "helm: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
