//! Test-only defects for the fault-injection suite, compiled into debug
//! builds only and off unless the proxy is started with
//! `--unsafe-retry-ambiguous-writes` or `--unsafe-forget-write-floors`
//! (see the cell's `chaos` module for why debug builds):
//! [`retries_ambiguous_writes`] and [`forgets_write_floors`] are `false` in
//! every release build.

/// (d) Writes whose outcome is unknown are sent again, as if they had
/// surely failed: one client write can then take effect twice.
#[cfg(debug_assertions)]
static RETRY_AMBIGUOUS_WRITES: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// Switches defect (d) on for the life of the process.
#[cfg(debug_assertions)]
pub fn retry_ambiguous_writes() {
    tracing::warn!("UNSAFE: writes with an unknown outcome are retried (safety suite)");
    RETRY_AMBIGUOUS_WRITES.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// Whether writes with an unknown outcome are retried (defect (d)).
pub fn retries_ambiguous_writes() -> bool {
    #[cfg(debug_assertions)]
    return RETRY_AMBIGUOUS_WRITES.load(std::sync::atomic::Ordering::Relaxed);
    #[cfg(not(debug_assertions))]
    false
}

/// (e) A write's revision does not become its client's floor (the proxy
/// review's P3): a serializable read right after a client's own write may
/// then come from a cache or member behind it.
#[cfg(debug_assertions)]
static FORGET_WRITE_FLOORS: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// Switches defect (e) on for the life of the process.
#[cfg(debug_assertions)]
pub fn forget_write_floors() {
    tracing::warn!("UNSAFE: writes do not raise their client's floor (safety suite)");
    FORGET_WRITE_FLOORS.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// Whether writes leave their client's floor alone (defect (e)).
pub fn forgets_write_floors() -> bool {
    #[cfg(debug_assertions)]
    return FORGET_WRITE_FLOORS.load(std::sync::atomic::Ordering::Relaxed);
    #[cfg(not(debug_assertions))]
    false
}
