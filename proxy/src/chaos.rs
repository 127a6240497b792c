//! Test-only defects for the fault-injection suite, compiled in only with
//! `--features chaos`: [`retries_ambiguous_writes`] is `false` in every
//! other build.

/// (d) Writes whose outcome is unknown are sent again, as if they had
/// surely failed: one client write can then take effect twice.
#[cfg(feature = "chaos")]
static RETRY_AMBIGUOUS_WRITES: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// Switches defect (d) on for the life of the process.
#[cfg(feature = "chaos")]
pub fn retry_ambiguous_writes() {
    tracing::warn!("UNSAFE: writes with an unknown outcome are retried (safety suite)");
    RETRY_AMBIGUOUS_WRITES.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// Whether writes with an unknown outcome are retried (defect (d)).
pub fn retries_ambiguous_writes() -> bool {
    #[cfg(feature = "chaos")]
    return RETRY_AMBIGUOUS_WRITES.load(std::sync::atomic::Ordering::Relaxed);
    #[cfg(not(feature = "chaos"))]
    false
}
