//! [`ReadPermits`]: whose permission each client watch stands on, checked
//! again whenever the cell's auth records change.
//!
//! A client watch is served from a watch the proxy holds as itself, after
//! the cell said the client may read the range (`ops::auth::require_read`).
//! A permission revoked later must end the client's watch too, as a
//! member's own watch streams end theirs. So every client watch holds a
//! [`ReadPermit`]: its reader (the client's token until the cell, asked at
//! the first check, verifies it and names its user; an empty user for a
//! watch begun while authentication was off), the range, and the revision
//! at which the cell last allowed it (0 for a new one: the proxy's own
//! probe may have been answered on auth records older than the revision it
//! reports, so the first check confirms it, within a second).
//!
//! One task per proxy ([`ReadPermits::run`]) wakes when the cell's auth
//! version rises (`upstream::identity` asks for it every
//! `STATUS_INTERVAL`) and once a second, and asks the cell
//! (`latchkey.proxyauth.v1.ProxyAuth/CheckReads`, as the proxy) about
//! every permit last allowed before that version, one check per distinct
//! reader and range. A refused permit's watch is cancelled with the
//! cell's reason ([`Cancel::Revoked`](crate::watch::Cancel::Revoked)); an
//! allowed one is marked with the answer's revision.
//!
//! When the cell cannot be asked, nothing is cancelled: the check runs
//! again at the next wake. A watch outlives an outage of its permission
//! checks, as it outlives one of its upstream (which ends it only when
//! the members lose their leader).

use crate::tenant_limits::TenantWatch;
use crate::upstream::{Cell, Kind, Route};
use latchkey_shared::etcd_methods::proxy_auth::CHECK_READS;
use latchkey_shared::proxy_auth_pb::{CheckReadsRequest, CheckReadsResponse, ReadCheck};
use latchkey_shared::{ApiError, ErrorCode, KeyRange};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

/// How often permits are looked at without a rise of the auth version: a
/// permit allowed by a member that had not applied the newest auth change
/// yet is asked about again within this.
const RECHECK_INTERVAL: Duration = Duration::from_secs(1);

/// Distinct (user, range) checks per request to the cell.
const CHECKS_PER_CALL: usize = 1_000;

/// How often a failing check is logged.
const WARN_EVERY: Duration = Duration::from_secs(60);

/// Whom a permit reads for.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Reader {
    /// A user the cell named (empty: authentication was off).
    User(Arc<str>),
    /// The token the client sent and when (unix ms), until the cell, asked
    /// at the next check, verifies it as of then and names its user: the
    /// proxy never takes a user from a token itself.
    Token(Arc<str>, u64),
}

struct Entry {
    reader: Reader,
    range: KeyRange,
    /// The audit stream: the user must hold root (the range is latchkey's).
    admin: bool,
    /// The revision at which the cell last allowed it.
    allowed_at: i64,
    revoke: Option<oneshot::Sender<ApiError>>,
}

#[derive(Default)]
pub struct ReadPermits {
    entries: Mutex<HashMap<u64, Entry>>,
    next_id: AtomicU64,
}

/// One client watch's standing; dropping it (the watch ended) forgets it.
pub struct ReadPermit {
    id: u64,
    permits: Arc<ReadPermits>,
    revoked: oneshot::Receiver<ApiError>,
    /// The watch's places in its tenants' watch quotas.
    _tenant_watch: Option<TenantWatch>,
}

impl ReadPermit {
    /// Holds the watch's place in its tenant's quota as long as it lives.
    pub fn holding(mut self, tenant_watch: TenantWatch) -> ReadPermit {
        self._tenant_watch = Some(tenant_watch);
        self
    }

    /// Resolves when the client may no longer read its range, with why.
    pub async fn revoked(&mut self) -> ApiError {
        match (&mut self.revoked).await {
            Ok(why) => why,
            // The registry forgot this permit only because it was
            // dropped; it never resolves then.
            Err(_) => std::future::pending().await,
        }
    }
}

impl Drop for ReadPermit {
    fn drop(&mut self) {
        self.permits.lock().remove(&self.id);
    }
}

/// One question for the cell: may this reader still read this range (or,
/// admin, still hold root).
type Question = (Reader, KeyRange, bool);

/// The permits each question stands for.
type Due = HashMap<Question, Vec<u64>>;

impl ReadPermits {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Entry>> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A permit for `reader` to read `range` (`admin`: to hold root),
    /// which the cell allowed at `allowed_at` (0: not yet confirmed; the
    /// next check asks).
    pub fn grant(
        self: &Arc<Self>,
        reader: Reader,
        range: KeyRange,
        admin: bool,
        allowed_at: i64,
    ) -> ReadPermit {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (revoke, revoked) = oneshot::channel();
        self.lock().insert(
            id,
            Entry {
                reader,
                range,
                admin,
                allowed_at,
                revoke: Some(revoke),
            },
        );
        ReadPermit {
            id,
            permits: self.clone(),
            revoked,
            _tenant_watch: None,
        }
    }

    /// Checks permits again on every rise of `cell`'s auth version and
    /// every [`RECHECK_INTERVAL`], until `shutdown`.
    pub async fn run(self: Arc<Self>, cell: Cell, shutdown: CancellationToken) {
        let mut version = cell.watch_auth_revision();
        let mut tick = tokio::time::interval(RECHECK_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut warned: Option<tokio::time::Instant> = None;
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                changed = version.changed() => if changed.is_err() { return },
                _ = tick.tick() => {}
            }
            if let Err(e) = self.check_due(&cell).await {
                if warned.is_none_or(|at| at.elapsed() >= WARN_EVERY) {
                    tracing::warn!(error = %e,
                        "cannot check client watches' permissions with the cell; they run on until it answers");
                    warned = Some(tokio::time::Instant::now());
                }
            }
        }
    }

    /// The permits last allowed before the cell's auth version, by user
    /// and range.
    fn due(&self, version: i64) -> Due {
        let mut due = Due::new();
        for (id, entry) in self.lock().iter() {
            if entry.allowed_at < version && entry.revoke.is_some() {
                due.entry((entry.reader.clone(), entry.range.clone(), entry.admin))
                    .or_default()
                    .push(*id);
            }
        }
        due
    }

    /// Asks the cell about every permit due, and acts on the answers.
    pub async fn check_due(&self, cell: &Cell) -> Result<(), ApiError> {
        let version = cell.auth_revision() as i64;
        let due: Vec<_> = self.due(version).into_iter().collect();
        for chunk in due.chunks(CHECKS_PER_CALL) {
            let request = CheckReadsRequest {
                checks: chunk
                    .iter()
                    .map(|((reader, range, admin), _)| {
                        let (user, token, at_unix_ms) = match reader {
                            Reader::User(user) => (user.to_string(), String::new(), 0),
                            Reader::Token(token, at) => {
                                // Of a token joined for several cells,
                                // this cell's part.
                                let token =
                                    crate::upstream::cell_tokens::for_cell(token, cell.cell_id());
                                (String::new(), token.to_string(), *at)
                            }
                        };
                        ReadCheck {
                            user,
                            token,
                            at_unix_ms,
                            key: range.start.clone(),
                            range_end: range.end.clone(),
                            admin: *admin,
                        }
                    })
                    .collect(),
            };
            let answer: CheckReadsResponse = cell
                .call(Route::Any, Kind::Read, CHECK_READS, request)
                .await?;
            if answer.answers.len() != chunk.len() {
                return Err(ApiError::internal(format!(
                    "the cell answered {} of {} permission checks",
                    answer.answers.len(),
                    chunk.len()
                )));
            }
            let at = answer.header.map_or(0, |h| h.revision);
            let mut entries = self.lock();
            for ((_, ids), answer) in chunk.iter().zip(answer.answers) {
                let refused = (!answer.code.is_empty()).then(|| {
                    let code =
                        ErrorCode::from_name(&answer.code).unwrap_or(ErrorCode::PermissionDenied);
                    ApiError::new(code, answer.message)
                });
                let user: Arc<str> = Arc::from(answer.user);
                for id in ids {
                    let Some(entry) = entries.get_mut(id) else {
                        continue;
                    };
                    match &refused {
                        None => {
                            entry.allowed_at = entry.allowed_at.max(at);
                            // From now on, the user the cell named, if it
                            // answered on the newest auth records (else
                            // the token is asked about again).
                            if at >= version {
                                entry.reader = Reader::User(user.clone());
                            }
                        }
                        Some(why) => {
                            if let Some(revoke) = entry.revoke.take() {
                                let _ = revoke.send(why.clone());
                            }
                        }
                    }
                }
            }
        }
        Ok(())
    }
}
