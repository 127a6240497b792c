//! # latchkey-proxy
//!
//! The stateless front door to latchkey cells (DESIGN sections 1, 3, 6):
//! clients speak HTTP/JSON or etcd's v3 gRPC to any proxy; the proxy keeps
//! their sessions alive with one refresh batch per tick, and passes
//! everything else to the cell that holds the key.
//!
//! ## Layers
//! Each module imports only modules on lower layers (and the shared crate):
//!
//! 1. [`config`] (flags with `LATCHKEY_*` environment fallbacks),
//!    [`metrics_catalog`] (every metric the proxy records, named and
//!    described once), [`dev`] (a one-member cell in the same process for
//!    `--dev`), [`chaos`] (test-only switches of debug builds).
//! 2. [`upstream`]: the cells as the proxy sees them: channels to their
//!    members, the leader tracker, and the one call path that routes,
//!    times and retries (by retry class only); [`session`]: the session
//!    table and the keep-alive batcher; [`tenant_limits`]: tenants' request
//!    rates, read from the cell and enforced from this proxy's share.
//! 3. [`watch`]: watch coalescing: one shared upstream watch per distinct
//!    client watch (gRPC and SSE alike), on one multiplexed stream per
//!    member, resumed on another member when its member fails; each client
//!    paced by its offset inside `--fanout-jitter`.
//! 4. [`cache`]: serializable reads from ranges kept current by the
//!    proxy's own watches; no client's revision goes backwards.
//! 5. [`state`]: [`state::ProxyState`], the handles every operation uses.
//! 6. [`ops`]: what the proxy does, in etcd's words, whichever face asked:
//!    ranges through the read cache, writes to the leader, grant and
//!    revoke with the session table, idempotency guards, and the lock
//!    recipe's backend over the cell client and coalesced watches;
//!    [`admin`]: `/metrics`, `/healthz`, `/readyz`.
//! 7. The faces, side by side, which import [`ops`] and never each other:
//!    [`grpc`] (the etcd v3 services) and [`http`] (the `/v1` JSON API, its
//!    Server-Sent Events watch and its OpenAPI document).
//! 8. [`tls`]: the listeners' and the cell connections' TLS, loaded from
//!    the flags' files; [`proxy`]: [`proxy::Proxy::start`] binds the
//!    addresses and spawns the servers and background jobs under one
//!    lifecycle.
//!
//! Data flows: a request arrives on `grpc` or `http` -> a handler turns it
//! into etcd's message and calls `ops` -> `upstream::CellClient::call`
//! sends it to the member its route names -> the answer goes back as it
//! is (gRPC) or as JSON (HTTP). A keep-alive stops at `session::SessionTable`; the batcher
//! carries it to the cell on the next tick.

pub mod admin;
pub mod cache;
pub mod chaos;
pub mod config;
pub mod dev;
pub mod directory_cli;
pub mod grpc;
pub mod http;
pub mod metrics_catalog;
pub mod ops;
pub mod proxy;
pub mod session;
pub mod state;
pub mod tenant_limits;
pub mod tls;
pub mod upstream;
pub mod watch;
