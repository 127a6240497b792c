//! [`KeepAliveBatcher`]: ONE task per proxy that sends the cell, once per
//! tick, one refresh batch holding every lease a client refreshed since
//! that lease's previous upstream refresh, and applies the cell's answers
//! to the [`SessionTable`].
//!
//! The batch goes over the shared [`RefreshStream`], which moves to the
//! leader the cell names and to another member when one fails. A batch
//! that fails puts its leases back for the next tick; the clients keep
//! being answered from what the cell confirmed before, and a client whose
//! confirmed time runs down waits for the cell instead of being told more.

use super::registry::{Answer, SessionTable};
use crate::metrics_catalog::{
    REFRESH_BATCHES, REFRESH_BATCH_LEASES, REFRESH_FAILURES, REFRESH_SECONDS, SESSIONS,
};
use latchkey_shared::client::{is_gone, RefreshStream};
use latchkey_shared::limits::MAX_REFRESH_BATCH;
use latchkey_shared::LeaseId;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;

/// How long one batch may wait for its answer, over all members tried. A
/// live leader answers a 100 000-lease batch in well under 100 ms; one that
/// has not answered in 2 s is down or cut off, and the next tick's batch
/// (carrying these leases again) goes to another member.
const BATCH_TIMEOUT: Duration = Duration::from_secs(2);

/// Sweep the table for sessions the cell has expired every this many
/// ticks (a sweep walks every entry; every 10 ticks is every 5 s at the
/// default tick).
const SWEEP_EVERY: u64 = 10;

pub struct KeepAliveBatcher {
    pub table: Arc<SessionTable>,
    pub stream: RefreshStream,
    pub tick: Duration,
}

impl KeepAliveBatcher {
    pub async fn run(mut self, shutdown: CancellationToken) {
        let mut ticks = tokio::time::interval(self.tick);
        // A batch that took longer than a tick is not followed by a burst:
        // at most one batch per tick, whatever happened.
        ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut count: u64 = 0;
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = ticks.tick() => {}
            }
            count += 1;
            let due = self.table.take_due();
            if !due.is_empty() {
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = self.send(&due) => {}
                }
            }
            if count.is_multiple_of(SWEEP_EVERY) {
                let grace = self.tick * 2;
                let dropped = self.table.sweep(Instant::now(), grace);
                if dropped > 0 {
                    tracing::debug!(dropped, "sessions the cell has expired left the table");
                }
            }
            metrics::gauge!(SESSIONS.name).set(self.table.len() as f64);
        }
    }

    /// One tick's batch (split only past the cell's batch limit).
    async fn send(&mut self, due: &[LeaseId]) {
        for chunk in due.chunks(MAX_REFRESH_BATCH) {
            let ids: Vec<i64> = chunk.iter().map(|id| id.get()).collect();
            let sent = Instant::now();
            metrics::counter!(REFRESH_BATCHES.name).increment(1);
            metrics::histogram!(REFRESH_BATCH_LEASES.name).record(ids.len() as f64);
            match self.stream.refresh(&ids, BATCH_TIMEOUT).await {
                Ok(reply) if reply.ttls.len() == ids.len() => {
                    metrics::histogram!(REFRESH_SECONDS.name).record(sent.elapsed().as_secs_f64());
                    for (id, ttl) in chunk.iter().zip(reply.ttls) {
                        let answer = if is_gone(ttl) {
                            Answer::Gone
                        } else {
                            Answer::Alive(ttl)
                        };
                        self.table.answered(*id, answer, sent);
                    }
                }
                Ok(reply) => {
                    metrics::counter!(REFRESH_FAILURES.name).increment(1);
                    tracing::warn!(
                        endpoint = %reply.endpoint,
                        asked = ids.len(),
                        answered = reply.ttls.len(),
                        "a refresh answer does not match its batch; the leases go in the next one"
                    );
                    self.table.retry(chunk);
                }
                Err(e) => {
                    metrics::counter!(REFRESH_FAILURES.name).increment(1);
                    tracing::warn!(error = %e, leases = ids.len(), "refresh batch failed; the leases go in the next one");
                    self.table.retry(chunk);
                }
            }
        }
    }
}
