//! The proxy's metrics, named once with their type, unit and HELP text
//! (STYLE habit 15), all under `latchkey_proxy_`. A call site names a
//! metric by its constant: `metrics::counter!(CACHE_HITS.name)`.
//! [`describe`], called by [`crate::proxy::Proxy::start`], gives `/metrics`
//! their descriptions, and those of the shared crate's metrics (the lock
//! recipe runs here too). With `--dev`, the embedded cell's
//! `Cell::start` describes the cell's.

use latchkey_shared::metrics_catalog::{describe_all, Kind, Metric};
use metrics::Unit;

// Client requests (grpc/request_metrics.rs, http/mod.rs).

pub const REQUEST_SECONDS: Metric = Metric {
    name: "latchkey_proxy_request_seconds",
    kind: Kind::Histogram,
    unit: Unit::Seconds,
    help: "Time the proxy took to answer a client request, by api (grpc or http) and route (the etcd gRPC method path, or the HTTP method and route template).",
};

pub const REQUESTS: Metric = Metric {
    name: "latchkey_proxy_requests_total",
    kind: Kind::Counter,
    unit: Unit::Count,
    help: "gRPC client requests the proxy answered (unary calls, and each keep-alive of a stream), by api (grpc), route (the etcd gRPC method path, or unknown) and outcome (ok, the error code's name, or grpc_ and the gRPC status).",
};

pub const HTTP_RESPONSES: Metric = Metric {
    name: "latchkey_proxy_http_responses_total",
    kind: Kind::Counter,
    unit: Unit::Count,
    help: "HTTP responses the proxy sent, by route (the HTTP method and route template, or unrouted) and status (the HTTP status code).",
};

// Calls to the cells (upstream/cell_client.rs).

pub const UPSTREAM_SECONDS: Metric = Metric {
    name: "latchkey_proxy_upstream_seconds",
    kind: Kind::Histogram,
    unit: Unit::Seconds,
    help: "Time a unary call to the cell took, retries on other members included, by path (the etcd gRPC method path).",
};

pub const UPSTREAM_ERRORS: Metric = Metric {
    name: "latchkey_proxy_upstream_errors_total",
    kind: Kind::Counter,
    unit: Unit::Count,
    help: "Failed attempts of calls to a cell member (unary calls and watch stream openings, each attempt counted, retried or not), by code (the error code's name).",
};

// Sessions (grpc/lease.rs, http/session.rs, session/keepalive_batcher.rs).

pub const KEEPALIVES: Metric = Metric {
    name: "latchkey_proxy_keepalives_total",
    kind: Kind::Counter,
    unit: Unit::Count,
    help: "Session keep-alives clients sent to the proxy, by api (grpc: a LeaseKeepAlive stream message; http: POST /v1/sessions/{id}/keepalive).",
};

pub const SESSIONS: Metric = Metric {
    name: "latchkey_proxy_sessions",
    kind: Kind::Gauge,
    unit: Unit::Count,
    help: "Sessions in the proxy's session table, set at each refresh tick.",
};

pub const REFRESH_BATCHES: Metric = Metric {
    name: "latchkey_proxy_refresh_batches_total",
    kind: Kind::Counter,
    unit: Unit::Count,
    help: "Refresh batches the proxy sent to the cell: at most one per --refresh-tick with leases due, split only past the cell's batch limit.",
};

pub const REFRESH_BATCH_LEASES: Metric = Metric {
    name: "latchkey_proxy_refresh_batch_leases",
    kind: Kind::Histogram,
    unit: Unit::Count,
    help: "Leases in one refresh batch the proxy sent to the cell.",
};

pub const REFRESH_SECONDS: Metric = Metric {
    name: "latchkey_proxy_refresh_seconds",
    kind: Kind::Histogram,
    unit: Unit::Seconds,
    help: "Time from sending a refresh batch to the cell's whole answer, for batches answered in full.",
};

pub const REFRESH_FAILURES: Metric = Metric {
    name: "latchkey_proxy_refresh_failures_total",
    kind: Kind::Counter,
    unit: Unit::Count,
    help: "Refresh batches that failed or were answered with a TTL count unlike the batch's; their leases go in the next batch.",
};

// Client watches (grpc/watch.rs, http/watch_sse.rs, watch/fanout.rs).

pub const WATCH_STREAMS: Metric = Metric {
    name: "latchkey_proxy_watch_streams",
    kind: Kind::Gauge,
    unit: Unit::Count,
    help: "gRPC Watch streams clients hold open on the proxy.",
};

pub const CLIENT_WATCHES: Metric = Metric {
    name: "latchkey_proxy_client_watches",
    kind: Kind::Gauge,
    unit: Unit::Count,
    help: "Client watches open on the proxy, by api (grpc: a watch on a gRPC Watch stream; sse: an HTTP Server-Sent Events watch).",
};

pub const SLOW_CLIENTS_CANCELLED: Metric = Metric {
    name: "latchkey_proxy_slow_clients_cancelled_total",
    kind: Kind::Counter,
    unit: Unit::Count,
    help: "Client watches (gRPC and SSE) the proxy cancelled because the client read its events too slowly.",
};

pub const FANOUT_DELAY_SECONDS: Metric = Metric {
    name: "latchkey_proxy_fanout_delay_seconds",
    kind: Kind::Histogram,
    unit: Unit::Seconds,
    help: "Time from a revision's arrival at the proxy to its hand-out to one client watch, the watch's --fanout-jitter offset included.",
};

pub const WATCH_EVENTS_OUT: Metric = Metric {
    name: "latchkey_proxy_watch_events_out_total",
    kind: Kind::Counter,
    unit: Unit::Count,
    help: "Events handed out to client watches (gRPC and SSE), each event counted once per watch that gets it.",
};

// Shared upstream watches (watch/).

pub const UPSTREAM_WATCH_STREAMS: Metric = Metric {
    name: "latchkey_proxy_upstream_watch_streams",
    kind: Kind::Gauge,
    unit: Unit::Count,
    help: "Multiplexed watch streams open from the proxy to cell members.",
};

pub const UPSTREAM_WATCHES: Metric = Metric {
    name: "latchkey_proxy_upstream_watches",
    kind: Kind::Gauge,
    unit: Unit::Count,
    help: "Shared watches the proxy holds on the cells, one per distinct watched key or range however many subscribe to it.",
};

pub const WATCH_EVENTS_IN: Metric = Metric {
    name: "latchkey_proxy_watch_events_in_total",
    kind: Kind::Counter,
    unit: Unit::Count,
    help: "Events the proxy's shared watches received from the cells.",
};

pub const WATCH_CATCH_UPS: Metric = Metric {
    name: "latchkey_proxy_watch_catch_ups_total",
    kind: Kind::Counter,
    unit: Unit::Count,
    help: "Watches that started before their shared watch's history and were served by a private upstream watch until they met it.",
};

pub const SLOW_WATCHERS: Metric = Metric {
    name: "latchkey_proxy_slow_watchers_total",
    kind: Kind::Counter,
    unit: Unit::Count,
    help: "Subscribers (client watches, cached ranges, lock waits) a shared watch dropped because their queue was full.",
};

// The read cache (cache/).

pub const CACHE_HITS: Metric = Metric {
    name: "latchkey_proxy_cache_hits_total",
    kind: Kind::Counter,
    unit: Unit::Count,
    help: "Serializable Range requests the proxy answered from its read cache.",
};

pub const CACHE_MISSES: Metric = Metric {
    name: "latchkey_proxy_cache_misses_total",
    kind: Kind::Counter,
    unit: Unit::Count,
    help: "Serializable Range requests at the latest revision that the read cache could not answer and a member did.",
};

pub const CACHE_RANGES: Metric = Metric {
    name: "latchkey_proxy_cache_ranges",
    kind: Kind::Gauge,
    unit: Unit::Count,
    help: "Key ranges the read cache holds, each kept current by a watch.",
};

pub const CACHE_BYTES: Metric = Metric {
    name: "latchkey_proxy_cache_bytes",
    kind: Kind::Gauge,
    unit: Unit::Bytes,
    help: "Size of the key-values the read cache holds.",
};

pub const CACHE_NOT_ADMITTED: Metric = Metric {
    name: "latchkey_proxy_cache_not_admitted_total",
    kind: Kind::Counter,
    unit: Unit::Count,
    help: "Ranges read often enough to cache that the full read cache did not take: every range it holds was read within the last 10 s (the read was forwarded).",
};

pub const CACHE_EVICTIONS: Metric = Metric {
    name: "latchkey_proxy_cache_evictions_total",
    kind: Kind::Counter,
    unit: Unit::Count,
    help: "Ranges the read cache evicted: least recently used first to stay within its range count or byte budget, and any nobody read for 10 s.",
};

// Tenants' request rates and watch quotas (tenant_limits.rs).

pub const RATE_LIMITED: Metric = Metric {
    name: "latchkey_proxy_rate_limited_total",
    kind: Kind::Counter,
    unit: Unit::Count,
    help: "Client requests this proxy refused with rate_limited past a tenant's request rate, by tenant and scope (tenant: its requests_per_second; user: its user_requests_per_second).",
};

pub const QUOTA_REFUSED: Metric = Metric {
    name: "latchkey_proxy_quota_refused_total",
    kind: Kind::Counter,
    unit: Unit::Count,
    help: "Client requests this proxy refused with quota_exceeded past its share of a tenant's quota, by tenant and quota (watches: max_watches).",
};

pub const TENANTS_KNOWN: Metric = Metric {
    name: "latchkey_proxy_tenants",
    kind: Kind::Gauge,
    unit: Unit::Count,
    help: "Tenants this proxy knows from the cell's Tenants service (read every second), whose request rates it enforces.",
};

pub const DIRECTORY_VERSION: Metric = Metric {
    name: "latchkey_proxy_directory_version",
    kind: Kind::Gauge,
    unit: Unit::Count,
    help: "The version of the directory of cells this proxy routes by (0: none, one cell).",
};

pub const DIRECTORY_CELLS: Metric = Metric {
    name: "latchkey_proxy_directory_cells",
    kind: Kind::Gauge,
    unit: Unit::Count,
    help: "Cells this proxy routes to, home included.",
};

/// Every metric the proxy records.
pub const ALL: &[Metric] = &[
    REQUEST_SECONDS,
    REQUESTS,
    HTTP_RESPONSES,
    UPSTREAM_SECONDS,
    UPSTREAM_ERRORS,
    KEEPALIVES,
    SESSIONS,
    REFRESH_BATCHES,
    REFRESH_BATCH_LEASES,
    REFRESH_SECONDS,
    REFRESH_FAILURES,
    WATCH_STREAMS,
    CLIENT_WATCHES,
    SLOW_CLIENTS_CANCELLED,
    FANOUT_DELAY_SECONDS,
    WATCH_EVENTS_OUT,
    UPSTREAM_WATCH_STREAMS,
    UPSTREAM_WATCHES,
    WATCH_EVENTS_IN,
    WATCH_CATCH_UPS,
    SLOW_WATCHERS,
    CACHE_HITS,
    CACHE_MISSES,
    CACHE_RANGES,
    CACHE_BYTES,
    CACHE_NOT_ADMITTED,
    CACHE_EVICTIONS,
    RATE_LIMITED,
    QUOTA_REFUSED,
    TENANTS_KNOWN,
    DIRECTORY_VERSION,
    DIRECTORY_CELLS,
];

/// Describes the proxy's metrics and the shared crate's to the process's
/// recorder (a no-op without one; a second call changes nothing).
pub fn describe() {
    describe_all(ALL);
    latchkey_shared::metrics_catalog::describe();
}

#[cfg(test)]
mod tests {
    use super::*;
    use latchkey_shared::metrics_catalog::{self as shared, checks};

    #[test]
    fn the_catalog_is_well_formed_and_apart_from_the_shared_and_cell_ones() {
        let all: Vec<Metric> = ALL
            .iter()
            .chain(shared::ALL)
            .chain(latchkey_cell::metrics_catalog::ALL)
            .copied()
            .collect();
        checks::well_formed(&all);
        for m in ALL {
            assert!(
                m.name.starts_with("latchkey_proxy_"),
                "{}: the proxy's metrics are under latchkey_proxy_",
                m.name
            );
        }
    }

    #[test]
    fn the_crate_spells_no_metric_name_outside_the_catalog() {
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        checks::no_literal_names_outside_the_catalog(&src);
    }
}
