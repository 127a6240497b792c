#!/usr/bin/env bash
# schemathesis against the HTTP API of a live proxy: `latchkey-proxy --dev`
# (a one-member cell in its process) on free loopback ports, every
# operation of /v1/openapi.json generated from the schema (its coverage,
# fuzzing and stateful phases, a fixed seed). It fails on any 5xx and on
# any response outside the schema: status code, content type, headers and
# body. (Requests the server refuses although the schema allows them are
# reported as warnings, not failures: the schema is looser than the
# server's checks in places, never the other way round.)
#
#   scripts/test-schemathesis.sh BIN_DIR [EXAMPLES]   # BIN_DIR holds latchkey-proxy
#
# EXAMPLES (default 10) is schemathesis's --max-examples per operation.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/tools.sh
source scripts/tools.sh
bin_dir=${1:?usage: scripts/test-schemathesis.sh BIN_DIR [EXAMPLES]}
examples=${2:-10}
proxy=$bin_dir/latchkey-proxy
[ -x "$proxy" ] || { echo "no latchkey-proxy in $bin_dir" >&2; exit 2; }
schemathesis_is_pinned || { echo "schemathesis $SCHEMATHESIS_VERSION is missing: run scripts/install-deps.sh" >&2; exit 2; }

work=$(mktemp -d)
pid=""
cleanup() {
  [ -z "$pid" ] || { kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null || true; }
  rm -rf "$work"
}
trap cleanup EXIT

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
http=127.0.0.1:$(free_port) grpc=127.0.0.1:$(free_port) metrics=127.0.0.1:$(free_port)
"$proxy" --dev --data-dir "$work/data" --http-addr "$http" --grpc-addr "$grpc" \
  --metrics-addr "$metrics" >"$work/proxy.log" 2>&1 &
pid=$!
for _ in $(seq 120); do
  [ "$(curl -s -o /dev/null -m 2 -w '%{http_code}' "http://$metrics/readyz" || true)" = 200 ] && break
  kill -0 "$pid" 2>/dev/null || { echo "latchkey-proxy --dev exited:" >&2; tail -20 "$work/proxy.log" >&2; exit 1; }
  sleep 0.5
done

set +e
# From the temporary directory: schemathesis keeps a cache (.schemathesis/)
# in its working directory, which must not land in the work tree.
cd "$work"
"$SCHEMATHESIS" run "http://$http/v1/openapi.json" \
  --checks not_a_server_error,status_code_conformance,content_type_conformance,response_headers_conformance,response_schema_conformance \
  --max-examples "$examples" --request-timeout 10 --seed 1 --no-color >"$work/st.out" 2>&1
rc=$?
set -e
sed -n '/SUMMARY/,$p' "$work/st.out"
if [ "$rc" = 0 ]; then
  echo "test result: ok. schemathesis found no 5xx and no response outside the schema; (scripts/test-schemathesis.sh)"
else
  cat "$work/st.out"
  echo "--- proxy log (last 20 lines):"
  tail -20 "$work/proxy.log"
  echo "test result: FAILED. schemathesis exited $rc; (scripts/test-schemathesis.sh)"
  exit 1
fi
