//! [`ProxyState`]: what every request handler of both APIs shares.

use crate::cache::{ClientFloors, ReadCache};
use crate::session::SessionTable;
use crate::tenant_limits::TenantLimits;
use crate::upstream::Upstream;
use crate::watch::cell_coalescers::CellCoalescers;
use crate::watch::client_watches::ClientWatches;
use crate::watch::fanout::Fanout;
use crate::watch::read_permits::ReadPermits;
use latchkey_shared::auth::limiter::AttemptLimiter;
use latchkey_shared::idempotency::RetentionLease;
use latchkey_shared::lifecycle::Lifecycle;
use std::sync::Arc;
use std::time::Duration;

pub struct ProxyState {
    pub upstream: Arc<Upstream>,
    pub sessions: Arc<SessionTable>,
    /// The cells besides home each session is extended to.
    pub extensions: Arc<crate::session::extensions::LeaseExtensions>,
    /// One shared upstream watch per distinct client watch, per cell.
    pub coalescers: CellCoalescers,
    /// Each client watch's offset inside `--fanout-jitter`.
    pub fanout: Fanout,
    /// The limits on client watches (`--max-watches`,
    /// `--max-watches-per-stream`).
    pub client_watches: ClientWatches,
    /// Serializable reads answered from ranges the proxy watches.
    pub cache: Arc<ReadCache>,
    /// The revision each client was last answered at.
    pub floors: ClientFloors,
    /// The lease idempotency records are written with.
    pub retention: RetentionLease,
    /// How long a client request may take, retries included.
    pub request_timeout: Duration,
    /// Largest HTTP request body accepted.
    pub max_request_bytes: usize,
    /// Owns the per-stream tasks (watch and keep-alive streams).
    pub lifecycle: Lifecycle,
    /// Authenticate attempts per client address (`ops::auth`).
    pub auth_attempts: AttemptLimiter,
    /// The user and range each client watch reads for, checked again when
    /// the cell's auth records change.
    pub read_permits: Arc<ReadPermits>,
    /// Tenants' request rates, from this proxy's share.
    pub tenant_limits: Arc<TenantLimits>,
    /// Unknown tokens this proxy asks the cell about (`ops::rates`).
    pub token_checks: AttemptLimiter,
}
