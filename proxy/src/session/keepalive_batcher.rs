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
//!
//! Sessions extended to other cells ([`LeaseExtensions`]) are refreshed
//! there too: each tick, the leases of the home batch extended to a cell go
//! to that cell's task ([`CellBatcher`]), which sends them in one batch of
//! its own, so a slow or leaderless cell delays no other cell's batch.

use super::extensions::LeaseExtensions;
use super::registry::{Answer, SessionTable};
use crate::metrics_catalog::{
    REFRESH_BATCHES, REFRESH_BATCH_LEASES, REFRESH_FAILURES, REFRESH_SECONDS, SESSIONS,
};
use crate::upstream::{Cell, Kind, Route};
use latchkey_shared::client::{is_gone, RefreshStream};
use latchkey_shared::limits::MAX_REFRESH_BATCH;
use latchkey_shared::tls::ClientTls;
use latchkey_shared::LeaseId;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
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
    pub upstream: Arc<crate::upstream::Upstream>,
    pub extensions: Arc<LeaseExtensions>,
    /// For the other cells' refresh streams.
    pub tls: Option<ClientTls>,
}

impl KeepAliveBatcher {
    pub async fn run(mut self, shutdown: CancellationToken) {
        // Each other cell's batches, by its members' addresses.
        let mut cells: HashMap<Vec<String>, mpsc::Sender<Vec<LeaseId>>> = HashMap::new();
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
                let alive = tokio::select! {
                    _ = shutdown.cancelled() => return,
                    alive = self.send(&due) => alive,
                };
                // Only what home confirmed alive in this tick is refreshed
                // elsewhere: a session never lives on in part.
                self.hand_out_extended(&alive, &mut cells, &shutdown);
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

    /// Gives each other cell's task the leases of `due` extended to it.
    fn hand_out_extended(
        &self,
        due: &[LeaseId],
        cells: &mut HashMap<Vec<String>, mpsc::Sender<Vec<LeaseId>>>,
        shutdown: &CancellationToken,
    ) {
        let mut batches: HashMap<Vec<String>, (Cell, Vec<LeaseId>)> = HashMap::new();
        for id in due {
            for cell in self.extensions.cells_of(*id) {
                let addrs: Vec<String> = cell.members.iter().map(|m| m.addr.clone()).collect();
                batches
                    .entry(addrs)
                    .or_insert_with(|| (cell.clone(), Vec::new()))
                    .1
                    .push(*id);
            }
        }
        for (addrs, (cell, ids)) in batches {
            let sender = match cells.get(&addrs) {
                Some(sender) => sender.clone(),
                None => match self.start_cell(cell, shutdown) {
                    Ok(sender) => cells.entry(addrs).or_insert(sender).clone(),
                    Err(e) => {
                        tracing::warn!(error = %e, "no refresh stream to a cell sessions are extended to");
                        continue;
                    }
                },
            };
            // A cell still busy with earlier batches misses this one: its
            // leases go again with their clients' next keep-alives.
            if sender.try_send(ids).is_err() {
                metrics::counter!(REFRESH_FAILURES.name).increment(1);
            }
        }
    }

    fn start_cell(
        &self,
        cell: Cell,
        shutdown: &CancellationToken,
    ) -> Result<mpsc::Sender<Vec<LeaseId>>, latchkey_shared::client::ClientError> {
        let addrs: Vec<String> = cell.members.iter().map(|m| m.addr.clone()).collect();
        let stream = RefreshStream::new(addrs)?
            .with_tls(self.tls.clone())
            .with_own_credentials(cell.own_credentials.clone());
        let (tx, rx) = mpsc::channel(2);
        let batcher = CellBatcher {
            cell,
            stream,
            table: self.table.clone(),
            home: self.upstream.home().clone(),
            extensions: self.extensions.clone(),
        };
        tokio::spawn(batcher.run(rx, shutdown.child_token()));
        Ok(tx)
    }

    /// One tick's batch (split only past the cell's batch limit).
    /// Returns the leases the cell answered alive.
    async fn send(&mut self, due: &[LeaseId]) -> Vec<LeaseId> {
        let mut alive = Vec::new();
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
                        if matches!(answer, Answer::Alive(_)) {
                            alive.push(*id);
                        }
                        let adopted =
                            matches!(answer, Answer::Alive(_)) && !self.table.confirmed(*id);
                        self.table.answered(*id, answer, sent);
                        if adopted {
                            // A session new to this proxy: where else is it?
                            let (extensions, upstream, id) =
                                (self.extensions.clone(), self.upstream.clone(), *id);
                            tokio::spawn(async move {
                                if let Err(e) = extensions.adopt(&upstream, id).await {
                                    tracing::warn!(lease_id = %id, error = %e, "reading a session's cells");
                                }
                            });
                        }
                        if answer == Answer::Gone && !self.extensions.cells_of(*id).is_empty() {
                            // Gone at home: gone everywhere.
                            let extensions = self.extensions.clone();
                            let id = *id;
                            tokio::spawn(async move { extensions.revoke(id).await });
                        }
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
        alive
    }
}

/// One other cell's refresh batches for the sessions extended to it.
struct CellBatcher {
    cell: Cell,
    stream: RefreshStream,
    table: Arc<SessionTable>,
    home: Cell,
    extensions: Arc<LeaseExtensions>,
}

impl CellBatcher {
    async fn run(mut self, mut batches: mpsc::Receiver<Vec<LeaseId>>, shutdown: CancellationToken) {
        while let Some(Some(due)) = shutdown.run_until_cancelled(batches.recv()).await {
            for chunk in due.chunks(MAX_REFRESH_BATCH) {
                let ids: Vec<i64> = chunk.iter().map(|id| id.get()).collect();
                metrics::counter!(REFRESH_BATCHES.name).increment(1);
                match self.stream.refresh(&ids, BATCH_TIMEOUT).await {
                    Ok(reply) if reply.ttls.len() == ids.len() => {
                        for (id, ttl) in chunk.iter().zip(reply.ttls) {
                            if is_gone(ttl) {
                                self.end_everywhere(*id).await;
                            }
                        }
                    }
                    Ok(_) | Err(_) => {
                        metrics::counter!(REFRESH_FAILURES.name).increment(1);
                        tracing::warn!(
                            cell = %self.cell.members[0].addr,
                            leases = ids.len(),
                            "an extension refresh batch failed; its leases go with their next keep-alives"
                        );
                    }
                }
            }
        }
    }

    /// A session's extension is gone in this cell (it expired there): the
    /// session ends in every cell, home first.
    async fn end_everywhere(&self, id: LeaseId) {
        tracing::warn!(lease_id = %id, "a session's extension expired in another cell; revoking the session");
        let at_home: Result<latchkey_shared::etcdpb::PbLeaseRevokeResponse, _> = self
            .home
            .call(
                Route::Leader,
                Kind::Write,
                latchkey_shared::etcd_methods::lease::REVOKE,
                latchkey_shared::etcdpb::PbLeaseRevokeRequest { id: id.get() },
            )
            .await;
        if let Err(e) = at_home {
            tracing::warn!(lease_id = %id, error = %e, "revoking a session at home; it expires in its TTL");
        }
        self.table.revoked(id);
        let _ = self.extensions.revoke(id).await;
    }
}
