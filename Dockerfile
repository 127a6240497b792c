# syntax=docker/dockerfile:1
#
# One image for both tiers: latchkey-cell (a member of a Raft cell) and
# latchkey-proxy (the stateless front door). helm/latchkey runs it.
#
#   docker build -t latchkey:dev .
#   docker run --rm -p 7700:7700 -p 7701:7701 latchkey:dev     # proxy --dev
#
# Stage 1 builds both binaries in release mode; stage 2 is a Debian slim
# runtime with the two binaries and etcdctl, running as an unprivileged
# user. Both stages are Debian bookworm, so the binaries find the same
# glibc and libstdc++ they were linked against.

ARG RUST_VERSION=1.95
ARG DEBIAN_RELEASE=bookworm

FROM rust:${RUST_VERSION}-slim-${DEBIAN_RELEASE} AS toolchain
# A failing command, in a pipe or a loop too, fails the RUN.
SHELL ["/bin/bash", "-eo", "pipefail", "-c"]

# What building needs (scripts/install-deps.sh checks the same on a
# developer's machine): libclang for the RocksDB bindings (bindgen),
# protoc for gRPC code generation, g++ and make for RocksDB's C++.
# Versions come from the pinned Debian release, not from pins per package:
# bookworm's security updates replace them and an exact pin would break the
# build on the next point release.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends libclang-dev protobuf-compiler g++ make \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src

# The planner turns the whole source tree into a recipe: the lock file,
# every workspace member's manifest, each build script with the files it
# reads (everything in its package but the Rust sources), and a stub for
# every target cargo metadata lists. The members come from the workspace
# itself, so adding one needs no change here. The recipe's content changes
# only with the manifests, so the dependency layer below stays cached
# across source edits (BuildKit keys `COPY --from` on content, not times).
FROM toolchain AS planner
SHELL ["/bin/bash", "-eo", "pipefail", "-c"]
COPY . .
RUN mkdir -p /recipe \
 && cp Cargo.toml Cargo.lock /recipe/ \
 && cargo metadata --no-deps --format-version 1 >/tmp/metadata.json \
 && grep -o '"manifest_path":"[^"]*"' /tmp/metadata.json | cut -d'"' -f4 | while read -r m; do \
      d=$(dirname "${m#"$PWD"/}"); \
      mkdir -p "/recipe/$d" && cp "$d/Cargo.toml" "/recipe/$d/"; \
      if [ -f "$d/build.rs" ]; then \
        tar -C "$d" --exclude=./src --exclude=./tests --exclude=./benches --exclude=./examples -cf - . \
          | tar -C "/recipe/$d" -xf -; \
      fi; \
    done \
 && grep -o '"src_path":"[^"]*"' /tmp/metadata.json | cut -d'"' -f4 | while read -r t; do \
      t=${t#"$PWD"/}; \
      case "$t" in */build.rs) continue ;; esac; \
      mkdir -p "/recipe/$(dirname "$t")" && echo 'fn main() {}' >"/recipe/$t"; \
    done

FROM toolchain AS builder
# Dependencies only: ~400 crates, RocksDB's C++ above all (80-90% of a
# clean build), compiled against the stubs.
COPY --from=planner /recipe ./
RUN cargo build --release --locked -p latchkey-cell -p latchkey-proxy --bins
# The real sources. COPY keeps the files' own modification times, which
# may be older than the stub build: touch every Rust file so cargo rebuilds
# the workspace crates (only them; the dependencies are not in /src).
COPY . .
RUN find . -path ./target -prune -o -name '*.rs' -exec touch {} + \
 && cargo build --release --locked -p latchkey-cell -p latchkey-proxy --bins \
 && install -D -m 0755 target/release/latchkey-cell target/release/latchkey-proxy /out/

FROM debian:${DEBIAN_RELEASE}-slim AS runtime
SHELL ["/bin/bash", "-eo", "pipefail", "-c"]

# etcdctl (Debian's etcd-client, the version the compatibility tests run)
# is the operator's tool for this service: member add/promote/remove, the
# backup CronJob's `snapshot save`, and the chart's start script, which
# lists the members and adds a learner pod to the cell.
# No CA certificates: latchkey speaks plain HTTP/gRPC and dials nothing on
# the internet. Versions: see the builder stage.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends etcd-client \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 65532 latchkey \
 && useradd --system --uid 65532 --gid 65532 --home-dir /var/lib/latchkey --shell /usr/sbin/nologin latchkey \
 && install -d -o 65532 -g 65532 -m 0750 /var/lib/latchkey

COPY --from=builder /out/latchkey-cell /out/latchkey-proxy /usr/local/bin/

# Inside a container the loopback defaults of the binaries reach nobody:
# listen on every interface. A flag given on the command line wins.
ENV LATCHKEY_HTTP_ADDR=0.0.0.0:7700 \
    LATCHKEY_GRPC_ADDR=0.0.0.0:7701 \
    LATCHKEY_METRICS_ADDR=0.0.0.0:7711 \
    LATCHKEY_DATA_DIR=/var/lib/latchkey/data \
    LATCHKEY_HEALTH_PORT=7711

# proxy HTTP, gRPC, metrics; cell client, peer, metrics.
EXPOSE 7700 7701 7711 7801 7901 7811

WORKDIR /var/lib/latchkey
# Numeric, so Kubernetes' runAsNonRoot can verify it without /etc/passwd.
USER 65532:65532

# /healthz on the metrics port: 7711 for a proxy (the default command),
# 7811 for a cell (run it with LATCHKEY_HEALTH_PORT=7811). bash's /dev/tcp
# makes the request, so the image needs no curl or wget. Kubernetes ignores
# this; the chart has its own probes.
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
  CMD ["/bin/bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/${LATCHKEY_HEALTH_PORT} && printf 'GET /healthz HTTP/1.0\\r\\n\\r\\n' >&3 && head -n 1 <&3 | grep -q ' 200 '"]

# A working one-member setup with no other flag: a cell inside the proxy's
# process, data under /var/lib/latchkey/data.
CMD ["latchkey-proxy", "--dev"]
