//! # latchkey-proxy
//!
//! The stateless front door to latchkey cells (DESIGN sections 1, 3, 6):
//! clients speak HTTP/JSON or etcd's v3 gRPC to any proxy; the proxy keeps
//! their sessions alive with one refresh batch per tick, and passes
//! everything else to the cell that holds the key.
//!
//! ## Layout
//! - [`config`]: flags with `LATCHKEY_*` environment fallbacks.
//! - [`proxy`]: [`proxy::Proxy::start`] binds the addresses and spawns the
//!   servers and background jobs under one lifecycle; [`dev`] adds a
//!   one-member cell in the same process for `--dev`.
//! - [`state`]: [`state::ProxyState`], what both APIs' handlers share.
//! - [`upstream`]: the cells as the proxy sees them: channels to their
//!   members, the leader tracker, and the one call path that routes,
//!   times and retries (by retry class only).
//! - [`session`]: the session table and the keep-alive batcher.
//! - [`watch`]: watch coalescing: one shared upstream watch per distinct
//!   client watch (gRPC and SSE alike), on one multiplexed stream per
//!   member, resumed on another member when its member fails; each client
//!   paced by its offset inside `--fanout-jitter`.
//! - [`lock_backend`]: the shared lock recipe's backend over the cell
//!   client and coalesced watches, behind the shared `v3lockpb.Lock`
//!   service.
//! - [`idempotency`]: the retention lease idempotency records are written
//!   with, and the guard of a request that names an `Idempotency-Key`.
//! - [`cache`]: serializable reads from ranges kept current by the
//!   proxy's own watches; no client's revision goes backwards.
//! - [`grpc`]: the etcd v3 services; [`http`]: the `/v1` JSON API, its
//!   Server-Sent Events watch and its OpenAPI document; [`admin`]:
//!   `/metrics`, `/healthz`, `/readyz`.
//!
//! Data flows: a request arrives on `grpc` or `http` -> a handler turns it
//! into etcd's message -> `upstream::CellClient::call` sends it to the
//! member its route names -> the answer goes back as it is (gRPC) or as
//! JSON (HTTP). A keep-alive stops at `session::SessionTable`; the batcher
//! carries it to the cell on the next tick.

pub mod admin;
pub mod cache;
pub mod chaos;
pub mod config;
pub mod dev;
pub mod grpc;
pub mod http;
pub mod idempotency;
pub mod lock_backend;
pub mod proxy;
pub mod session;
pub mod state;
pub mod upstream;
pub mod watch;
