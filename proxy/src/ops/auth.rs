//! Who a client is, at the proxy, and what it may do. The cell is the only
//! judge: the proxy holds no auth records.
//!
//! - A call the proxy makes on a client's behalf (KV operations, lease
//!   grant, revoke and time-to-live, membership, maintenance, the Auth API)
//!   carries the client's own token (`Who::Client`), never the proxy's,
//!   so the cell checks it as if the client had called it directly.
//! - What the proxy does with its own identity for many clients (shared
//!   watches, batched keep-alives, the lock and election recipes, the
//!   idempotency records, the read cache) is done only after the cell has
//!   answered a probe sent with the client's token that asks for exactly
//!   the permission the operation needs and changes nothing (`require_*`).
//!   While the cell has authentication off the probes are skipped; while
//!   the proxy does not know yet, they are sent.
//!
//! The client's token reaches the operations through [`as_client`], set
//! once per request by each face (gRPC metadata `token`, HTTP
//! `Authorization: Bearer`).

use crate::state::ProxyState;
use crate::upstream::cell_client::HasHeader;
use crate::upstream::{Cell, Kind, Route, Who};
use crate::watch::read_permits::{ReadPermit, Reader};
use latchkey_shared::auth_pb::{AuthUserListRequest, AuthUserListResponse};
use latchkey_shared::etcd_enums::{CompareResult, CompareTarget};
use latchkey_shared::etcd_methods::auth::USER_LIST;
use latchkey_shared::etcd_methods::kv::{RANGE, TXN};
use latchkey_shared::etcd_methods::lease::TIME_TO_LIVE;
use latchkey_shared::etcdpb::{
    PbCompare, PbDeleteRequest, PbLeaseTimeToLiveRequest, PbLeaseTimeToLiveResponse,
    PbRangeRequest, PbRangeResponse, PbTargetUnion, PbTxnOpRequest, PbTxnRequest, PbTxnRequestOp,
    PbTxnResponse,
};
use latchkey_shared::txn_op::op;
use latchkey_shared::{ApiError, ErrorCode, KeyRange};
use std::future::Future;
use std::sync::Arc;

tokio::task_local! {
    static CLIENT_TOKEN: Option<Arc<str>>;
}

/// Runs `f` as the client that sent `token`.
pub async fn as_client<F: Future>(token: Option<Arc<str>>, f: F) -> F::Output {
    CLIENT_TOKEN.scope(token, f).await
}

/// The token of the client this task serves (none outside [`as_client`]).
pub fn client_token() -> Option<Arc<str>> {
    CLIENT_TOKEN.try_with(|t| t.clone()).ok().flatten()
}

/// A call to `cell`'s leader made for this task's client: with its token
/// (or none), never the proxy's own.
pub async fn call_for_client<Req, Resp>(
    cell: &Cell,
    kind: Kind,
    path: &'static str,
    request: Req,
) -> Result<Resp, ApiError>
where
    Req: prost::Message + Clone + Send + Sync + 'static,
    Resp: prost::Message + Default + Send + Sync + HasHeader + 'static,
{
    let token = client_token();
    cell.call_as(
        Who::Client(token.as_deref()),
        Route::Leader,
        kind,
        path,
        request,
    )
    .await
}

/// A token as clients send it: etcd's bare token, or `Bearer <token>`.
pub fn token_from_header(value: &str) -> Option<Arc<str>> {
    let token = value.strip_prefix("Bearer ").unwrap_or(value).trim();
    (!token.is_empty()).then(|| Arc::from(token))
}

/// Failed Authenticate attempts one client address may make through a
/// proxy: 20 at once, then 10 a second. Successes do not count: etcd's Go
/// client authenticates again for every stream it opens. (The cell limits
/// failures per user, and per address, where a proxy's clients share the
/// proxy's.)
pub fn attempts_per_address() -> latchkey_shared::auth::limiter::AttemptLimiter {
    latchkey_shared::auth::limiter::AttemptLimiter::new(
        "failed Authenticate attempts from one address",
        10.0,
        20,
    )
}

/// Runs `authenticate` for the client at `client` if its address has a
/// failed attempt left; a success gives the attempt back.
pub async fn limited_authenticate<T>(
    state: &crate::state::ProxyState,
    client: Option<std::net::SocketAddr>,
    authenticate: impl Future<Output = Result<T, ApiError>>,
) -> Result<T, ApiError> {
    let key = client.map(|addr| addr.ip().to_string());
    if let Some(key) = &key {
        state.auth_attempts.take(key, tokio::time::Instant::now())?;
    }
    let answer = authenticate.await;
    if let (Ok(_), Some(key)) = (&answer, &key) {
        state.auth_attempts.refund(key);
    }
    answer
}

/// How long a login waits for each other cell: one that is down or slow
/// is left out of the token (the client's requests there are refused as
/// unauthenticated, and it logs in again), not a wait for every login.
const OTHER_CELL_LOGIN: std::time::Duration = std::time::Duration::from_secs(2);

/// A user's `request` that home answered with `answer`, asked of every
/// other cell the directory names too: the token answered carries a token
/// of each cell that authenticated the user ([`crate::upstream::cell_tokens`]),
/// so one token works wherever the directory routes the client's requests.
/// A cell that does not (no such user there, or authentication off) is
/// left out. With one cell the answer is home's as it is.
pub async fn for_every_cell(
    state: &crate::state::ProxyState,
    request: &latchkey_shared::auth_pb::AuthenticateRequest,
    mut answer: latchkey_shared::auth_pb::AuthenticateResponse,
) -> latchkey_shared::auth_pb::AuthenticateResponse {
    let cells = state.upstream.cells();
    if cells.len() < 2 {
        return answer;
    }
    let asked = cells.iter().skip(1).map(|cell| async move {
        let got = tokio::time::timeout(
            OTHER_CELL_LOGIN,
            cell.call_as::<_, latchkey_shared::auth_pb::AuthenticateResponse>(
                Who::Client(None),
                Route::Leader,
                Kind::Read,
                latchkey_shared::etcd_methods::auth::AUTHENTICATE,
                request.clone(),
            ),
        )
        .await;
        got.ok()?
            .ok()
            .zip(cell.cell_id())
            .map(|(a, id)| (id, a.token))
    });
    let others = futures::future::join_all(asked).await;
    let home = state.upstream.home().cell_id().unwrap_or(0);
    let mut parts = vec![(home, answer.token.clone())];
    parts.extend(others.into_iter().flatten());
    answer.token = crate::upstream::cell_tokens::join(&parts);
    answer
}

/// A compare that never holds (no key has a negative version), on a key
/// the client must be able to read anyway: a probe with it takes its
/// empty failure branch and writes nothing, after the cell has checked
/// every operation of its success branch.
fn never(key: &[u8]) -> PbCompare {
    PbCompare {
        result: CompareResult::Less as i32,
        target: CompareTarget::Version as i32,
        key: key.to_vec(),
        range_end: Vec::new(),
        target_union: Some(PbTargetUnion::Version(0)),
    }
}

/// Sends a probe txn as the client; `Ok` if the cell let it through.
async fn probe_txn(cell: &Cell, probe: PbTxnRequest) -> Result<(), ApiError> {
    let token = client_token();
    let _: PbTxnResponse = cell
        .call_as(
            Who::Client(token.as_deref()),
            Route::Leader,
            Kind::Read,
            TXN,
            probe,
        )
        .await?;
    Ok(())
}

/// The client may run `txn` (its compares and every operation of both
/// branches), which the proxy will run for it with its own identity.
pub async fn require_txn(cell: &Cell, txn: &PbTxnRequest) -> Result<(), ApiError> {
    if !cell.auth_may_be_on() {
        return Ok(());
    }
    let key = txn
        .compare
        .first()
        .map(|c| c.key.clone())
        .or_else(|| txn.success.iter().chain(&txn.failure).find_map(op_key))
        .unwrap_or_default();
    let mut compare = txn.compare.clone();
    compare.push(never(&key));
    probe_txn(
        cell,
        PbTxnRequest {
            compare,
            success: txn.success.iter().chain(&txn.failure).cloned().collect(),
            failure: Vec::new(),
        },
    )
    .await
}

fn op_key(op: &PbTxnRequestOp) -> Option<Vec<u8>> {
    match &op.request {
        Some(PbTxnOpRequest::RequestRange(r)) => Some(r.key.clone()),
        Some(PbTxnOpRequest::RequestPut(p)) => Some(p.key.clone()),
        Some(PbTxnOpRequest::RequestDeleteRange(d)) => Some(d.key.clone()),
        Some(PbTxnOpRequest::RequestTxn(t)) => t.compare.first().map(|c| c.key.clone()),
        None => None,
    }
}

/// The client may read `range` (a lock's state, an election's leader).
pub async fn require_read(cell: &Cell, range: &KeyRange) -> Result<(), ApiError> {
    if !cell.auth_may_be_on() {
        return Ok(());
    }
    probe_read(cell, range).await
}

/// Asks the cell, as the client, to read `range`.
async fn probe_read(cell: &Cell, range: &KeyRange) -> Result<(), ApiError> {
    let token = client_token();
    let probe = PbRangeRequest {
        key: range.start.clone(),
        range_end: range.end.clone(),
        limit: 1,
        serializable: true,
        count_only: true,
        ..Default::default()
    };
    let _: PbRangeResponse = cell
        .call_as(
            Who::Client(token.as_deref()),
            Route::Any,
            Kind::Read,
            RANGE,
            probe,
        )
        .await?;
    Ok(())
}

/// The client may read `range`, which the proxy will watch for it as
/// itself: the permit the client's watch stands on, checked again when
/// the cell's auth records change
/// ([`ReadPermits`](crate::watch::read_permits::ReadPermits)).
/// The watch is charged to its tenants' rates and holds a place in their
/// watch quotas while it lives.
pub async fn read_permit(state: &ProxyState, range: &KeyRange) -> Result<ReadPermit, ApiError> {
    super::rates::charge(state, || vec![range.clone()]).await?;
    let tenant_watch = state.tenant_limits.hold_watch(range)?;
    // Asked of the cell that holds the range; checked again later against
    // home's auth records (every cell is to have the same users and roles).
    let permit = match state
        .upstream
        .routed(std::slice::from_ref(range), |cell| async move {
            probe(&cell, || probe_read(&cell, range)).await
        })
        .await?
    {
        Probed::Skipped { known } => {
            state
                .read_permits
                .grant(Reader::User("".into()), range.clone(), false, known)
        }
        Probed::Allowed => state
            .read_permits
            .grant(client_reader(), range.clone(), false, 0),
    };
    Ok(permit.holding(tenant_watch))
}

/// As [`read_permit`], for a stream of latchkey's `range` only root may
/// read (the audit stream).
pub async fn admin_permit(state: &ProxyState, range: &KeyRange) -> Result<ReadPermit, ApiError> {
    Ok(
        match probe(state.upstream.home(), || probe_admin(state.upstream.home())).await? {
            Probed::Skipped { known } => {
                state
                    .read_permits
                    .grant(Reader::User("".into()), range.clone(), true, known)
            }
            Probed::Allowed => state
                .read_permits
                .grant(client_reader(), range.clone(), true, 0),
        },
    )
}

enum Probed {
    /// Authentication was off at auth version `known`.
    Skipped { known: i64 },
    /// The cell allowed it; the permit's first check confirms it (the
    /// cell's answer may rest on auth records older than the revision it
    /// reports).
    Allowed,
}

/// Runs `probe` unless `cell` has authentication off.
async fn probe<F: Future<Output = Result<(), ApiError>>>(
    cell: &Cell,
    probe: impl FnOnce() -> F,
) -> Result<Probed, ApiError> {
    // The version first: the status task stores "on" before the version,
    // so a version read before "off" is one under which it was off.
    let known = cell.auth_revision() as i64;
    if !cell.auth_may_be_on() {
        return Ok(Probed::Skipped { known });
    }
    probe().await?;
    Ok(Probed::Allowed)
}

/// Whom this task's client reads as: its token, whose user the cell names
/// at the permit's first check; an empty user without one.
fn client_reader() -> Reader {
    match client_token() {
        Some(token) => Reader::Token(token, latchkey_shared::auth::token::now_unix_ms()),
        None => Reader::User("".into()),
    }
}

/// The client may read and write every key of `range`: a lock's or an
/// election's queue (its name's prefix), or the key it holds.
pub async fn require_read_write(cell: &Cell, range: &KeyRange) -> Result<(), ApiError> {
    if !cell.auth_may_be_on() {
        return Ok(());
    }
    probe_txn(
        cell,
        PbTxnRequest {
            compare: vec![never(&range.start)],
            success: vec![
                op(PbTxnOpRequest::RequestRange(PbRangeRequest {
                    key: range.start.clone(),
                    range_end: range.end.clone(),
                    count_only: true,
                    ..Default::default()
                })),
                op(PbTxnOpRequest::RequestDeleteRange(PbDeleteRequest {
                    key: range.start.clone(),
                    range_end: range.end.clone(),
                    ..Default::default()
                })),
            ],
            failure: Vec::new(),
        },
    )
    .await
}

/// The client holds the root role (force-release, the audit stream).
pub async fn require_admin(cell: &Cell) -> Result<(), ApiError> {
    if !cell.auth_may_be_on() {
        return Ok(());
    }
    probe_admin(cell).await
}

/// Asks the cell, as the client, for something only root may.
async fn probe_admin(cell: &Cell) -> Result<(), ApiError> {
    let token = client_token();
    let _: AuthUserListResponse = cell
        .call_as(
            Who::Client(token.as_deref()),
            Route::Any,
            Kind::Read,
            USER_LIST,
            AuthUserListRequest {},
        )
        .await?;
    Ok(())
}

/// The client is authenticated (keep-alives, which need nothing more).
pub async fn require_authenticated(cell: &Cell) -> Result<(), ApiError> {
    if !cell.auth_may_be_on() {
        return Ok(());
    }
    let token = client_token();
    // Lease 0 never exists: the answer after the check is "not found".
    let asked: Result<PbLeaseTimeToLiveResponse, ApiError> = cell
        .call_as(
            Who::Client(token.as_deref()),
            Route::Any,
            Kind::Read,
            TIME_TO_LIVE,
            PbLeaseTimeToLiveRequest { id: 0, keys: false },
        )
        .await;
    match asked {
        Ok(_) => Ok(()),
        Err(e) if e.code == ErrorCode::LeaseNotFound => Ok(()),
        Err(e) => Err(e),
    }
}
