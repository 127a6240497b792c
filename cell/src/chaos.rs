//! Test-only hooks for the fault-injection suite. They are compiled into
//! debug builds only (what the tests and `scripts/run-dev.sh` run), and
//! there they do nothing unless a member is started with an `--unsafe-*`
//! flag; a release build (`cargo build --release`, the Docker image) has
//! none of this: no endpoint, no flag, no crash point.
//!
//! Debug builds carry them, rather than a build with a feature of its own,
//! so that the safety suite runs the very binaries every other test runs,
//! and the test command compiles the cell and the proxy once: a `chaos`
//! feature made cargo resolve the dependencies' features anew for the two
//! packages and compile tokio, hyper, tonic, openraft and the rest a
//! second time (205 s of a 2-core CI run).
//!
//! - Crash points at the persist steps ([`crash_point!`]): armed with the
//!   `fail` crate's action `return`, the member aborts there, as a process
//!   killed at that instant would. Other actions (`sleep(ms)`, `pause`,
//!   `panic`) act as the `fail` crate says. The points:
//!   [`LOG_APPEND_BEFORE_FSYNC`], [`LOG_APPEND_AFTER_FSYNC`],
//!   [`VOTE_SAVE`], [`SNAPSHOT_BEFORE_RENAME`], [`LOG_PURGE`], and
//!   [`COMMITTED_BEFORE_ANSWER`] (not a persist step: the moment a
//!   write's outcome becomes unknown to its client though it happened).
//!   `--unsafe-fail-points` serves `GET /debug/fail-points` (the points
//!   with their actions) and `PUT /debug/fail-points/{name}` (body: actions,
//!   arms one) on the metrics address ([`router`]); without it nothing can
//!   arm a point.
//! - Broken behaviours ([`Break`], flag `--unsafe-break`), each a defect
//!   the suite must report: a member misbehaves only where [`broken`]
//!   says so, and [`broken`] is `false` in every release build.

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

/// A crash point: nothing in a release build.
#[macro_export]
macro_rules! crash_point {
    ($name:expr) => {
        #[cfg(debug_assertions)]
        $crate::chaos::reached($name);
    };
}

/// The hooks this process was started with (once, at start).
#[cfg(debug_assertions)]
#[derive(Debug)]
struct Hooks {
    fail_points: bool,
    breaks: Vec<Break>,
}

#[cfg(debug_assertions)]
static HOOKS: std::sync::OnceLock<Hooks> = std::sync::OnceLock::new();

/// Switches the test-only hooks on for the life of the process: the
/// fail-point endpoint when `fail_points`, and the defects in `breaks`.
/// Called once, at start, by `main` with the `--unsafe-*` flags.
#[cfg(debug_assertions)]
pub fn switch_on(fail_points: bool, breaks: &[Break]) {
    if fail_points {
        tracing::warn!("UNSAFE: crash points can be armed at /debug/fail-points (safety suite)");
    }
    if !breaks.is_empty() {
        tracing::warn!(?breaks, "UNSAFE: defects switched on for the safety suite");
    }
    let _ = HOOKS.set(Hooks {
        fail_points,
        breaks: breaks.to_vec(),
    });
}

/// Whether crash points can be armed (`--unsafe-fail-points`).
#[cfg(debug_assertions)]
pub fn fail_points_on() -> bool {
    HOOKS.get().is_some_and(|h| h.fail_points)
}

/// What an armed point does when reached.
#[cfg(debug_assertions)]
pub fn reached(name: &str) {
    if fail_points_on() && fail::eval(name, |_| ()).is_some() {
        eprintln!("crash point {name}: aborting");
        std::process::abort();
    }
}

#[cfg(debug_assertions)]
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

/// Whether defect `b` is switched on.
#[cfg(debug_assertions)]
pub fn broken(b: Break) -> bool {
    HOOKS.get().is_some_and(|h| h.breaks.contains(&b))
}

/// Whether defect `b` is switched on: never in a release build.
#[cfg(not(debug_assertions))]
pub const fn broken(_: Break) -> bool {
    false
}
