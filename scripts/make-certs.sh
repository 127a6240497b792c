#!/usr/bin/env bash
# Makes a CA and certificates signed by it with openssl, for tests and for
# trying TLS out (docs/security.md shows the same recipe):
#
#   scripts/make-certs.sh DIR NAME=SAN[,SAN...] ...
#
# DIR/ca.pem and DIR/ca-key.pem are the CA (made on the first call, kept
# after); each NAME gets DIR/NAME.pem and DIR/NAME-key.pem: common name
# NAME, the subject alternative names given (IP:127.0.0.1, DNS:localhost),
# usable as a server and as a client certificate. A member's certificate
# names the host of its --peer-addr (and --client-addr); a client's common
# name is its identity. Keys are ECDSA P-256, certificates valid 825 days.
#
#   scripts/make-certs.sh certs member1=IP:127.0.0.1 proxy=IP:127.0.0.1,DNS:localhost
#
# `--no-cn` before some NAMEs gives those no common name (subject
# O=latchkey, OU=NAME): etcd's `grpc-proxy` refuses a client certificate
# towards its members that has one.
set -euo pipefail
if [ $# -lt 1 ]; then
  echo "usage: $0 DIR [NAME=SAN[,SAN...] ...]" >&2
  exit 2
fi
dir=$1
shift
mkdir -p "$dir"
if [ ! -f "$dir/ca.pem" ]; then
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
    -keyout "$dir/ca-key.pem" -out "$dir/ca.pem" -days 3650 \
    -subj "/CN=latchkey CA $(basename "$dir")" \
    -addext "basicConstraints=critical,CA:TRUE" \
    -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
fi
subject_of() { echo "/CN=$1"; }
for spec in "$@"; do
  if [ "$spec" = --no-cn ]; then
    subject_of() { echo "/O=latchkey/OU=$1"; }
    continue
  fi
  name=${spec%%=*}
  sans=${spec#*=}
  if [ -z "$name" ] || [ "$name" = "$spec" ] || [ -z "$sans" ]; then
    echo "$spec: expected NAME=SAN[,SAN...], e.g. member1=IP:127.0.0.1" >&2
    exit 2
  fi
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
    -keyout "$dir/$name-key.pem" -out "$dir/$name.csr" -subj "$(subject_of "$name")" 2>/dev/null
  openssl x509 -req -in "$dir/$name.csr" -CA "$dir/ca.pem" -CAkey "$dir/ca-key.pem" \
    -CAcreateserial -out "$dir/$name.pem" -days 825 \
    -extfile <(printf '%s\n' "subjectAltName=$sans" \
      "extendedKeyUsage=serverAuth,clientAuth" \
      "basicConstraints=critical,CA:FALSE" \
      "keyUsage=critical,digitalSignature") 2>/dev/null
  rm -f "$dir/$name.csr"
done
