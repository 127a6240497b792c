//! The cell's metrics, named once with their type, unit and HELP text
//! (STYLE habit 15). A call site names a metric by its constant:
//! `metrics::counter!(LEADER_CHANGES.name)`. [`describe`], called by
//! [`crate::cell::Cell::start`], gives `/metrics` their descriptions, and
//! those of the shared crate's metrics (the lock recipe runs here too).

use latchkey_shared::metrics_catalog::{describe_all, Kind, Metric};
use metrics::Unit;

// Raft and leadership (lease/lessor_loop.rs, admin.rs).

pub const LEADER_CHANGES: Metric = Metric {
    name: "latchkey_leader_changes_total",
    kind: Kind::Counter,
    unit: Unit::Count,
    help: "Changes of leader this member observed, including losing sight of a leader.",
};

pub const RAFT_TERM: Metric = Metric {
    name: "latchkey_raft_term",
    kind: Kind::Gauge,
    unit: Unit::Count,
    help: "The Raft term this member is in, set at each leader change and each scrape.",
};

pub const IS_LEADER: Metric = Metric {
    name: "latchkey_is_leader",
    kind: Kind::Gauge,
    unit: Unit::Count,
    help: "1 if this member leads and has heard from a quorum within the quorum timeout, else 0; set at each scrape.",
};

pub const HAS_LEADER: Metric = Metric {
    name: "latchkey_has_leader",
    kind: Kind::Gauge,
    unit: Unit::Count,
    help: "1 if this member knows a leader of its cell, else 0; set at each scrape.",
};

pub const LAST_LOG_INDEX: Metric = Metric {
    name: "latchkey_last_log_index",
    kind: Kind::Gauge,
    unit: Unit::Count,
    help: "The index of the last entry in this member's Raft log, set at each scrape.",
};

pub const LOG_PURGED_INDEX: Metric = Metric {
    name: "latchkey_log_purged_index",
    kind: Kind::Gauge,
    unit: Unit::Count,
    help: "The Raft log index up to which this member's log is purged (a member behind it catches up only from a snapshot); set at each scrape.",
};

// The Raft log and group commit (raft/).

pub const PROPOSAL_COMMIT_SECONDS: Metric = Metric {
    name: "latchkey_proposal_commit_seconds",
    kind: Kind::Histogram,
    unit: Unit::Seconds,
    help: "Time a write proposed on the leader took to be committed and applied there (or to fail), waiting for group commit included.",
};

pub const WRITES_PER_ENTRY: Metric = Metric {
    name: "latchkey_writes_per_entry",
    kind: Kind::Histogram,
    unit: Unit::Count,
    help: "Client writes the leader's group commit put into one Raft log entry, one sample per entry proposed.",
};

pub const LOG_FSYNC_SECONDS: Metric = Metric {
    name: "latchkey_log_fsync_seconds",
    kind: Kind::Histogram,
    unit: Unit::Seconds,
    help: "Time one fsync of this member's Raft log (the RocksDB write-ahead log) took.",
};

pub const LOG_APPENDS_PER_FSYNC: Metric = Metric {
    name: "latchkey_log_appends_per_fsync",
    kind: Kind::Histogram,
    unit: Unit::Count,
    help: "Raft log appends one fsync of this member's log made durable.",
};

pub const LOG_WRITES_PER_FSYNC: Metric = Metric {
    name: "latchkey_log_writes_per_fsync",
    kind: Kind::Histogram,
    unit: Unit::Count,
    help: "Client writes in the log entries one fsync made durable; fsyncs that carried none are not sampled.",
};

pub const READ_INDEX_WAITS: Metric = Metric {
    name: "latchkey_read_index_waits_total",
    kind: Kind::Counter,
    unit: Unit::Count,
    help: "Callers on this member (linearizable reads, and the leader's own quorum checks) that asked for a confirmed read index, whether they ran a round or shared one.",
};

pub const READ_INDEX_ROUNDS: Metric = Metric {
    name: "latchkey_read_index_rounds_total",
    kind: Kind::Counter,
    unit: Unit::Count,
    help: "Read-index rounds this member ran, each confirming every caller that arrived before it began (waits per round is the sharing).",
};

pub const FORWARDED_KEEP_ALIVES: Metric = Metric {
    name: "latchkey_forwarded_keep_alives_total",
    kind: Kind::Counter,
    unit: Unit::Count,
    help: "Keep-alives this member sent on to the leader while it followed.",
};

pub const FORWARDED_KEEP_ALIVE_BATCHES: Metric = Metric {
    name: "latchkey_forwarded_keep_alive_batches_total",
    kind: Kind::Counter,
    unit: Unit::Count,
    help: "Peer calls that carried those keep-alives: keep-alives that arrive together go in one refresh batch (keep-alives per batch is the sharing).",
};

pub const PEER_REQUESTS_REFUSED: Metric = Metric {
    name: "latchkey_peer_requests_refused_total",
    kind: Kind::Counter,
    unit: Unit::Count,
    help:
        "Peer requests this member refused because their cell id header named another cell or none, or (with peer TLS) their certificate named no member of the cell.",
};

// The applied state and snapshots (state_machine/store.rs).

pub const REVISION: Metric = Metric {
    name: "latchkey_revision",
    kind: Kind::Gauge,
    unit: Unit::Count,
    help: "The keyspace revision this member has applied.",
};

pub const KEYS: Metric = Metric {
    name: "latchkey_keys",
    kind: Kind::Gauge,
    unit: Unit::Count,
    help: "Live (not deleted) keys in this member's applied keyspace.",
};

pub const LEASES: Metric = Metric {
    name: "latchkey_leases",
    kind: Kind::Gauge,
    unit: Unit::Count,
    help: "Leases in this member's applied lease table.",
};

pub const KEYSPACE_BYTES: Metric = Metric {
    name: "latchkey_keyspace_bytes",
    kind: Kind::Gauge,
    unit: Unit::Bytes,
    help: "Size of this member's applied keyspace, the figure --quota-bytes limits.",
};

pub const TENANT_KEYS: Metric = Metric {
    name: "latchkey_tenant_keys",
    kind: Kind::Gauge,
    unit: Unit::Count,
    help: "Live keys under a tenant's prefixes (label tenant), what its max_keys quota limits, as this member has applied them; 0 once the tenant is deleted.",
};

pub const TENANT_BYTES: Metric = Metric {
    name: "latchkey_tenant_bytes",
    kind: Kind::Gauge,
    unit: Unit::Bytes,
    help: "Bytes of the live keys and values under a tenant's prefixes (label tenant), what its max_bytes quota limits.",
};

pub const LOG_STORE_MEMORY_BYTES: Metric = Metric {
    name: "latchkey_log_store_memory_bytes",
    kind: Kind::Gauge,
    unit: Unit::Bytes,
    help: "Memory the Raft log store (RocksDB) holds: memory tables and block cache; set at each scrape.",
};

pub const APPLIED_INDEX: Metric = Metric {
    name: "latchkey_applied_index",
    kind: Kind::Gauge,
    unit: Unit::Count,
    help: "The last Raft log index this member has applied.",
};

pub const SNAPSHOT_BUILD_SECONDS: Metric = Metric {
    name: "latchkey_snapshot_build_seconds",
    kind: Kind::Histogram,
    unit: Unit::Seconds,
    help: "Time this member took to build a snapshot of its state and write it to disk.",
};

pub const SNAPSHOTS_BUILT: Metric = Metric {
    name: "latchkey_snapshots_built_total",
    kind: Kind::Counter,
    unit: Unit::Count,
    help: "Snapshots this member built of its own state.",
};

pub const SNAPSHOT_INSTALLED_BYTES: Metric = Metric {
    name: "latchkey_snapshot_installed_bytes",
    kind: Kind::Gauge,
    unit: Unit::Bytes,
    help: "Size of the last snapshot this member received from the leader to install.",
};

pub const SNAPSHOTS_INSTALLED: Metric = Metric {
    name: "latchkey_snapshots_installed_total",
    kind: Kind::Counter,
    unit: Unit::Count,
    help: "Snapshots from the leader this member installed in place of its state.",
};

// Leases (lease/lessor_loop.rs, node.rs).

pub const LEASE_CHECKPOINTS: Metric = Metric {
    name: "latchkey_lease_checkpoints_total",
    kind: Kind::Counter,
    unit: Unit::Count,
    help: "Leases whose remaining TTL the leader's lessor committed in a checkpoint, so a new leader does not restart them at their full TTL.",
};

pub const LEASES_EXPIRED: Metric = Metric {
    name: "latchkey_leases_expired_total",
    kind: Kind::Counter,
    unit: Unit::Count,
    help: "Leases the leader's lessor found past their deadline and proposed to expire (a failed proposal is proposed, and counted, again).",
};

pub const LEASE_KEEPALIVES: Metric = Metric {
    name: "latchkey_lease_keepalives_total",
    kind: Kind::Counter,
    unit: Unit::Count,
    help: "Single-lease keep-alives (etcd's LeaseKeepAlive) this member received, counted on arrival whether or not the lease exists; proxies send none, they batch.",
};

pub const REFRESH_BATCHES: Metric = Metric {
    name: "latchkey_refresh_batches_total",
    kind: Kind::Counter,
    unit: Unit::Count,
    help: "Batches of latchkey's Refresh stream (what proxies send) received by this member and answered by the leader.",
};

pub const REFRESH_BATCH_LEASES: Metric = Metric {
    name: "latchkey_refresh_batch_leases_total",
    kind: Kind::Counter,
    unit: Unit::Count,
    help: "Leases named in the refresh batches of latchkey_refresh_batches_total, unknown ones (answered -1) included.",
};

// Client watches (watch/stream.rs).

pub const WATCH_STREAMS: Metric = Metric {
    name: "latchkey_watch_streams",
    kind: Kind::Gauge,
    unit: Unit::Count,
    help: "Watch streams (etcd Watch calls) open on this member.",
};

pub const WATCHERS: Metric = Metric {
    name: "latchkey_watchers",
    kind: Kind::Gauge,
    unit: Unit::Count,
    help: "Watches created and not yet cancelled on this member's watch streams.",
};

pub const WATCH_SLOW_STREAMS: Metric = Metric {
    name: "latchkey_watch_slow_streams_total",
    kind: Kind::Counter,
    unit: Unit::Count,
    help: "Times a watch stream fell behind this member's watch hub and caught its watches up from history instead.",
};

pub const WATCH_STREAMS_ENDED_NO_LEADER: Metric = Metric {
    name: "latchkey_watch_streams_ended_no_leader_total",
    kind: Kind::Counter,
    unit: Unit::Count,
    help: "Require-leader watch streams this member ended (or refused) because it had gone two election timeouts without a leader.",
};

pub const WATCH_COMMIT_TO_SEND_SECONDS: Metric = Metric {
    name: "latchkey_watch_commit_to_send_seconds",
    kind: Kind::Histogram,
    unit: Unit::Seconds,
    help: "Time from this member's apply of a revision to a watch stream having sent it (with the revisions batched after it) to its client; one sample per stream per batch.",
};

pub const WATCH_EVENTS_SENT: Metric = Metric {
    name: "latchkey_watch_events_sent_total",
    kind: Kind::Counter,
    unit: Unit::Count,
    help:
        "Events this member's watch streams sent to their clients, live and caught up from history.",
};

/// Every metric the cell records.
pub const ALL: &[Metric] = &[
    LEADER_CHANGES,
    RAFT_TERM,
    IS_LEADER,
    HAS_LEADER,
    LAST_LOG_INDEX,
    LOG_PURGED_INDEX,
    PROPOSAL_COMMIT_SECONDS,
    WRITES_PER_ENTRY,
    LOG_FSYNC_SECONDS,
    LOG_APPENDS_PER_FSYNC,
    LOG_WRITES_PER_FSYNC,
    READ_INDEX_WAITS,
    READ_INDEX_ROUNDS,
    FORWARDED_KEEP_ALIVES,
    FORWARDED_KEEP_ALIVE_BATCHES,
    PEER_REQUESTS_REFUSED,
    REVISION,
    KEYS,
    LEASES,
    KEYSPACE_BYTES,
    TENANT_KEYS,
    TENANT_BYTES,
    LOG_STORE_MEMORY_BYTES,
    APPLIED_INDEX,
    SNAPSHOT_BUILD_SECONDS,
    SNAPSHOTS_BUILT,
    SNAPSHOT_INSTALLED_BYTES,
    SNAPSHOTS_INSTALLED,
    LEASE_CHECKPOINTS,
    LEASES_EXPIRED,
    LEASE_KEEPALIVES,
    REFRESH_BATCHES,
    REFRESH_BATCH_LEASES,
    WATCH_STREAMS,
    WATCHERS,
    WATCH_SLOW_STREAMS,
    WATCH_STREAMS_ENDED_NO_LEADER,
    WATCH_COMMIT_TO_SEND_SECONDS,
    WATCH_EVENTS_SENT,
];

/// Describes the cell's metrics and the shared crate's to the process's
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
    fn the_catalog_is_well_formed_and_apart_from_the_shared_one() {
        let both: Vec<Metric> = ALL.iter().chain(shared::ALL).copied().collect();
        checks::well_formed(&both);
    }

    #[test]
    fn the_crate_spells_no_metric_name_outside_the_catalog() {
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        checks::no_literal_names_outside_the_catalog(&src);
    }
}
