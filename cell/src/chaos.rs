//! Test-only hooks for the fault-injection suite, compiled in only with
//! `--features chaos` (a production build has none of this: no
//! dependency, no endpoint, no flag).
//!
//! - Crash points at the persist steps ([`crash_point!`]): armed with the
//!   `fail` crate's action `return`, the member aborts there, as a process
//!   killed at that instant would. Other actions (`sleep(ms)`, `pause`,
//!   `panic`) act as the `fail` crate says. The points:
//!   [`LOG_APPEND_BEFORE_FSYNC`], [`LOG_APPEND_AFTER_FSYNC`],
//!   [`VOTE_SAVE`], [`SNAPSHOT_BEFORE_RENAME`], [`LOG_PURGE`], and
//!   [`COMMITTED_BEFORE_ANSWER`] (not a persist step: the moment a
//!   write's outcome becomes unknown to its client though it happened).
//! - Broken behaviours ([`Break`], flag `--unsafe-break`), each a defect
//!   the suite must report: a member misbehaves only where [`broken`]
//!   says so, and [`broken`] is `false` in every build without the
//!   feature.
//! - `GET /debug/fail-points` lists them with their actions, and
//!   `PUT /debug/fail-points/{name}` (body: actions) arms one, on the
//!   metrics address ([`router`]).

/// After the entries are written to RocksDB, before the fsync.
pub const LOG_APPEND_BEFORE_FSYNC: &str = "log-append-before-fsync";
/// After the fsync, before openraft hears that the entries are durable.
pub const LOG_APPEND_AFTER_FSYNC: &str = "log-append-after-fsync";
/// Before a vote is saved.
pub const VOTE_SAVE: &str = "vote-save";
/// After a snapshot file is written and synced, before it is renamed
/// into place.
pub const SNAPSHOT_BEFORE_RENAME: &str = "snapshot-before-rename";
/// Before a purge of the log is written.
pub const LOG_PURGE: &str = "log-purge";
/// On the leader, once a write is committed and applied, before it is
/// answered: the client's outcome is unknown though the write happened.
pub const COMMITTED_BEFORE_ANSWER: &str = "committed-before-answer";

/// Every crash point, for the listing.
pub const POINTS: [&str; 6] = [
    LOG_APPEND_BEFORE_FSYNC,
    LOG_APPEND_AFTER_FSYNC,
    VOTE_SAVE,
    SNAPSHOT_BEFORE_RENAME,
    LOG_PURGE,
    COMMITTED_BEFORE_ANSWER,
];

/// A crash point: nothing without the `chaos` feature.
#[macro_export]
macro_rules! crash_point {
    ($name:expr) => {
        #[cfg(feature = "chaos")]
        $crate::chaos::reached($name);
    };
}

/// What an armed point does when reached.
#[cfg(feature = "chaos")]
pub fn reached(name: &str) {
    if fail::eval(name, |_| ()).is_some() {
        eprintln!("crash point {name}: aborting");
        std::process::abort();
    }
}

#[cfg(feature = "chaos")]
pub fn router() -> axum::Router {
    use axum::extract::Path;
    use axum::http::StatusCode;
    use axum::routing::{get, put};
    async fn list() -> String {
        let armed = fail::list();
        POINTS
            .iter()
            .map(|p| {
                let actions = armed
                    .iter()
                    .find(|(name, _)| name == p)
                    .map_or("off", |(_, a)| a.as_str());
                format!("{p}={actions}\n")
            })
            .collect()
    }
    async fn arm(Path(name): Path<String>, actions: String) -> (StatusCode, String) {
        if !POINTS.contains(&name.as_str()) {
            return (StatusCode::NOT_FOUND, format!("no crash point {name}\n"));
        }
        match fail::cfg(name.clone(), actions.trim()) {
            Ok(()) => (StatusCode::OK, format!("{name}={}\n", actions.trim())),
            Err(e) => (StatusCode::BAD_REQUEST, format!("{e}\n")),
        }
    }
    axum::Router::new()
        .route("/debug/fail-points", get(list))
        .route("/debug/fail-points/{name}", put(arm))
}

/// A defect switched on for the safety suite to catch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Break {
    /// (a) A follower serves linearizable reads from its own state, with
    /// no read index from the leader.
    FollowerLocalReads,
    /// (b) A leader acknowledges keep-alives without a quorum confirming
    /// its leadership (the cell review's defect S1): a deposed leader
    /// refreshes leases the new one lets expire.
    UnconfirmedKeepAlives,
    /// (c) A leader serves linearizable reads from its own state without a
    /// quorum round: a paused or cut-off old leader answers stale.
    LeaderLocalReads,
}

#[cfg(feature = "chaos")]
static BREAKS: std::sync::OnceLock<Vec<Break>> = std::sync::OnceLock::new();

/// Switches `breaks` on for the life of the process (once, at start).
#[cfg(feature = "chaos")]
pub fn set_breaks(breaks: &[Break]) {
    if !breaks.is_empty() {
        tracing::warn!(?breaks, "UNSAFE: defects switched on for the safety suite");
    }
    let _ = BREAKS.set(breaks.to_vec());
}

/// Whether defect `b` is switched on.
#[cfg(feature = "chaos")]
pub fn broken(b: Break) -> bool {
    BREAKS.get().is_some_and(|on| on.contains(&b))
}

/// Whether defect `b` is switched on: never without the feature.
#[cfg(not(feature = "chaos"))]
pub const fn broken(_: Break) -> bool {
    false
}
