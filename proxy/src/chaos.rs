//! Test-only defects for the fault-injection suite, compiled into debug
//! builds only and off unless the proxy is started with
//! `--unsafe-retry-ambiguous-writes`, `--unsafe-forget-write-floors` or
//! `--unsafe-unfenced-moves` (see the cell's `chaos` module for why debug builds): [`broken`] is
//! `false` for every defect in every release build.

/// A defect the safety suite must catch when it is switched on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Defect {
    /// (d) Writes whose outcome is unknown are sent again, as if they had
    /// surely failed: one client write can then take effect twice.
    RetryAmbiguousWrites,
    /// (e) A write's revision does not become its client's floor (the
    /// proxy review's P3): a serializable read right after a client's own
    /// write may then come from a cache or member behind it.
    ForgetWriteFloors,
    /// (f) A prefix move switches cells without fencing the source first:
    /// writes the source takes after the follower's last look are never
    /// copied, so acknowledged writes are lost in the move.
    UnfencedMoves,
}

impl Defect {
    #[cfg(debug_assertions)]
    fn bit(self) -> u8 {
        match self {
            Defect::RetryAmbiguousWrites => 1,
            Defect::ForgetWriteFloors => 2,
            Defect::UnfencedMoves => 4,
        }
    }
}

/// The defects switched on, one bit each.
#[cfg(debug_assertions)]
static SWITCHED_ON: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

/// Switches `defect` on for the life of the process.
#[cfg(debug_assertions)]
pub fn switch_on(defect: Defect) {
    tracing::warn!(?defect, "UNSAFE: a deliberate defect is on (safety suite)");
    SWITCHED_ON.fetch_or(defect.bit(), std::sync::atomic::Ordering::Relaxed);
}

/// Whether `defect` is switched on.
#[cfg(debug_assertions)]
pub fn broken(defect: Defect) -> bool {
    SWITCHED_ON.load(std::sync::atomic::Ordering::Relaxed) & defect.bit() != 0
}

/// Whether `defect` is switched on: never in a release build.
#[cfg(not(debug_assertions))]
pub const fn broken(_: Defect) -> bool {
    false
}
