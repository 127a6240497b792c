//! [`LeaseExtensions`]: sessions that span cells (DESIGN section 9).
//!
//! A session is a lease of the home cell. When a client binds a key, a
//! lock or an election in another cell to it, the proxy first grants that
//! cell a lease with the same id and the same granted TTL (the session's
//! extension there), and from then on every refresh batch this proxy sends
//! home for the session also goes to each cell it was extended to, in that
//! cell's own batch of the same tick ([`KeepAliveBatcher`]).
//!
//! So a session ends in every cell within the same bounds: a client that
//! stops refreshing loses it in each cell one TTL after the last batch
//! that carried it (an extension made after that batch may outlive home's
//! by at most the time home's lease had already run down when it was
//! made); a revoke through the proxy revokes it at home, then in each
//! extension cell, one after the other: between the two, a client may see
//! the session's keys gone from home and still present in another cell.
//! An extension a cell says is gone (expired there while its batches
//! failed) revokes the session everywhere: it never lives on in part.
//!
//! Each extension is recorded in the home cell
//! ([`latchkey_shared::directory::session_cell_key`]), bound to the
//! session's lease, and every proxy follows those records
//! ([`LeaseExtensions::follow`]: one read, then a watch): whichever proxy a
//! session's keep-alives reach refreshes it in every cell it was extended
//! to, whichever proxy extended it, and forgets it when the records go with
//! the session. A proxy that takes a session over also reads its records
//! when the session is first confirmed to it, and a revoke through any
//! proxy reads them first ([`LeaseExtensions::adopt`]).
//!
//! [`KeepAliveBatcher`]: super::KeepAliveBatcher

use crate::upstream::{Cell, Kind, Route, Upstream};
use crate::watch::coalescer::Coalescer;
use crate::watch::{Cancel, Item, WatchKey};
use dashmap::DashMap;
use latchkey_shared::directory::{session_cell_key, session_cells_of, SESSION_CELLS_PREFIX};
use latchkey_shared::etcd_enums::EventType;
use latchkey_shared::etcd_methods::kv::PUT;
use latchkey_shared::etcd_methods::lease::{GRANT, REVOKE, TIME_TO_LIVE};
use latchkey_shared::etcdpb::{
    PbLeaseGrantRequest, PbLeaseGrantResponse, PbLeaseRevokeRequest, PbLeaseRevokeResponse,
    PbLeaseTimeToLiveRequest, PbLeaseTimeToLiveResponse, PbPutRequest, PbPutResponse,
};
use latchkey_shared::KeyRange;
use latchkey_shared::{ApiError, ErrorCode, LeaseId};
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// The session and cell a session-cells record names.
fn parse_record(key: &[u8]) -> Option<(LeaseId, String)> {
    let rest = key.strip_prefix(SESSION_CELLS_PREFIX)?;
    let slash = rest.iter().position(|b| *b == b'/')?;
    let id = std::str::from_utf8(&rest[..slash]).ok()?;
    let id = u64::from_str_radix(id, 16).ok()? as i64;
    let name = std::str::from_utf8(&rest[slash + 1..]).ok()?;
    Some((LeaseId::from(id), name.to_string()))
}

#[derive(Default)]
pub struct LeaseExtensions {
    /// Each extended session's cells besides home.
    cells: DashMap<LeaseId, Vec<Cell>>,
}

impl LeaseExtensions {
    /// Makes sure session `id` exists in `cell` (nothing to do for home, or
    /// for no lease): granted there with home's granted TTL the first time.
    pub async fn ensure(&self, upstream: &Upstream, cell: &Cell, id: i64) -> Result<(), ApiError> {
        if id == 0 || Arc::ptr_eq(cell, upstream.home()) {
            return Ok(());
        }
        let id = LeaseId::from(id);
        let known = self
            .cells
            .get(&id)
            .is_some_and(|cells| cells.iter().any(|c| Arc::ptr_eq(c, cell)));
        if known {
            return Ok(());
        }
        let at_home: PbLeaseTimeToLiveResponse = upstream
            .home()
            .call(
                Route::Leader,
                Kind::Read,
                TIME_TO_LIVE,
                PbLeaseTimeToLiveRequest {
                    id: id.get(),
                    keys: false,
                },
            )
            .await?;
        if at_home.ttl <= 0 {
            return Err(ApiError::lease_not_found(id));
        }
        let granted: Result<PbLeaseGrantResponse, ApiError> = cell
            .call(
                Route::Leader,
                Kind::Write,
                GRANT,
                PbLeaseGrantRequest {
                    ttl: at_home.granted_ttl,
                    id: id.get(),
                },
            )
            .await;
        match granted {
            Ok(g) if g.error.is_empty() => {}
            Ok(g) => {
                return Err(ApiError::unavailable(format!(
                    "session {id} could not be extended to another cell: {}",
                    g.error
                )))
            }
            // Extended before (by this proxy before a restart, or another).
            Err(e) if e.code == ErrorCode::LeaseExists => {}
            Err(e) => return Err(e),
        }
        // Then the record, bound to the session at home: written after the
        // grant, so a record always names a lease that was granted.
        let name = upstream
            .routes()
            .name_of(cell)
            .map(str::to_string)
            .ok_or_else(|| {
                ApiError::unavailable("the directory changed under a request; send it again")
            })?;
        let _: PbPutResponse = upstream
            .home()
            .call(
                Route::Leader,
                Kind::Write,
                PUT,
                PbPutRequest {
                    key: session_cell_key(id.get(), &name),
                    lease: id.get(),
                    ..Default::default()
                },
            )
            .await?;
        self.add(id, cell);
        Ok(())
    }

    fn add(&self, id: LeaseId, cell: &Cell) {
        let mut cells = self.cells.entry(id).or_default();
        if !cells.iter().any(|c| Arc::ptr_eq(c, cell)) {
            cells.push(cell.clone());
        }
    }

    /// Learns from the home cell's records where session `id` is extended
    /// (a session this proxy takes over).
    pub async fn adopt(&self, upstream: &Upstream, id: LeaseId) -> Result<(), ApiError> {
        let range = KeyRange::prefix(&session_cells_of(id.get()));
        let (records, _) = upstream.home().read_all(&range).await?;
        for kv in records {
            self.record(upstream, &kv.key, true).await;
        }
        Ok(())
    }

    /// [`ensure`](Self::ensure) for each of `ids`.
    pub async fn ensure_all(
        &self,
        upstream: &Upstream,
        cell: &Cell,
        ids: &[i64],
    ) -> Result<(), ApiError> {
        for id in ids {
            self.ensure(upstream, cell, *id).await?;
        }
        Ok(())
    }

    /// The cells session `id` is extended to.
    pub fn cells_of(&self, id: LeaseId) -> Vec<Cell> {
        self.cells.get(&id).map(|c| c.clone()).unwrap_or_default()
    }

    /// Revokes session `id` in every cell it was extended to and forgets
    /// it. A cell that does not have it (expired there) is fine.
    pub async fn revoke(&self, id: LeaseId) -> Result<(), ApiError> {
        let cells = self.take(id);
        Self::revoke_in(id, cells).await
    }

    /// The cells session `id` is extended to, forgotten here (taken before
    /// its revoke at home, whose deleted records make every proxy forget
    /// them as well).
    pub fn take(&self, id: LeaseId) -> Vec<Cell> {
        self.cells.remove(&id).map(|(_, c)| c).unwrap_or_default()
    }

    /// Gives back what [`take`](Self::take) took (the revoke at home
    /// failed).
    pub fn give_back(&self, id: LeaseId, cells: &[Cell]) {
        for cell in cells {
            self.add(id, cell);
        }
    }

    /// Revokes session `id` in `cells`.
    pub async fn revoke_in(id: LeaseId, cells: Vec<Cell>) -> Result<(), ApiError> {
        let mut failed = None;
        for cell in cells {
            let done: Result<PbLeaseRevokeResponse, ApiError> = cell
                .call(
                    Route::Leader,
                    Kind::Write,
                    REVOKE,
                    PbLeaseRevokeRequest { id: id.get() },
                )
                .await;
            match done {
                Ok(_) => {}
                Err(e) if e.code == ErrorCode::LeaseNotFound => {}
                Err(e) => {
                    tracing::warn!(lease_id = %id, error = %e, "revoking a session's extension; it expires in its TTL");
                    failed = Some(e);
                }
            }
        }
        failed.map_or(Ok(()), Err)
    }

    /// Follows every session's extensions from the home cell's records
    /// until `shutdown`: a full read, then a watch from its revision; read
    /// again after a compaction or a failure, a second later.
    pub async fn follow(
        self: Arc<Self>,
        upstream: Arc<Upstream>,
        coalescer: Arc<Coalescer>,
        shutdown: CancellationToken,
    ) {
        loop {
            // Sessions extend only to cells a directory names: a proxy in
            // front of one cell holds no watch for them.
            if upstream.routes().directory.cells.is_empty() {
                let wait = tokio::time::sleep(std::time::Duration::from_secs(1));
                if shutdown.run_until_cancelled(wait).await.is_none() {
                    return;
                }
                continue;
            }
            let ended = shutdown
                .run_until_cancelled(self.follow_once(&upstream, &coalescer))
                .await;
            match ended {
                None => return,
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "following sessions' extensions; reading them again")
                }
                Some(Ok(())) => {}
            }
            let pause = tokio::time::sleep(std::time::Duration::from_secs(1));
            if shutdown.run_until_cancelled(pause).await.is_none() {
                return;
            }
        }
    }

    async fn follow_once(
        &self,
        upstream: &Upstream,
        coalescer: &Arc<Coalescer>,
    ) -> Result<(), ApiError> {
        let range = KeyRange::prefix(SESSION_CELLS_PREFIX);
        let (records, revision) = upstream.home().read_all(&range).await?;
        for kv in &records {
            self.record(upstream, &kv.key, true).await;
        }
        let key = WatchKey::new(range.start.clone(), range.end.clone(), &[], false)?;
        let mut changes = coalescer.subscribe(key, revision + 1).await?;
        loop {
            match changes.recv().await {
                Some(Item::Events(revision)) => {
                    for e in revision.events.iter() {
                        if let Some(kv) = &e.kv {
                            let put = e.r#type != EventType::Delete as i32;
                            self.record(upstream, &kv.key, put).await;
                        }
                    }
                }
                Some(Item::Progress(_)) => {}
                Some(Item::Cancelled(Cancel::Compacted { .. })) | None => return Ok(()),
                Some(Item::Cancelled(Cancel::Ended { reason })) => {
                    return Err(ApiError::unavailable(reason))
                }
                Some(Item::Cancelled(Cancel::Revoked(e))) => return Err(e),
            }
        }
    }

    /// A session-cells record `key` appeared (`put`) or went.
    async fn record(&self, upstream: &Upstream, key: &[u8], put: bool) {
        let Some((id, name)) = parse_record(key) else {
            return;
        };
        if !put {
            if let Some(mut cells) = self.cells.get_mut(&id) {
                let routes = upstream.routes();
                cells.retain(|c| routes.name_of(c) != Some(name.as_str()));
            }
            self.cells.remove_if(&id, |_, cells| cells.is_empty());
            return;
        }
        let mut cell = upstream.routes().named(&name);
        if cell.is_none() {
            // Named by a directory newer than this proxy's.
            let _ = upstream.refresh().await;
            cell = upstream.routes().named(&name);
        }
        match cell {
            Some(cell) => self.add(id, &cell),
            None => {
                tracing::warn!(lease_id = %id, cell = %name, "a session is extended to a cell the directory does not name")
            }
        }
    }
}
