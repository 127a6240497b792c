//! [`CellClient`]: the proxy's channels to the members of one cell, and the
//! one place a forwarded call is sent, timed and retried.
//!
//! A call names a [`Route`]: writes and linearizable reads go to the
//! leader (a follower would forward them anyway, one hop later);
//! serializable reads are spread over the members. A failed attempt is
//! tried again, on another member or the leader it named, only when its
//! error's retry class says nothing happened ([`Retry::Safe`]), or when the
//! call is a read ([`Kind::Read`]) whose outcome is unknown. A write whose
//! outcome is unknown is reported as such and never resent. Every call ends
//! by the request deadline.

use super::accepted_tokens::AcceptedTokens;
use crate::chaos::{broken, Defect};
use crate::metrics_catalog::{UPSTREAM_ERRORS, UPSTREAM_SECONDS};
use latchkey_shared::client::own_credentials::attach_client_token;
use latchkey_shared::client::{call, endpoint, OwnCredentials};
use latchkey_shared::etcdpb::PbResponseHeader;
use latchkey_shared::tls::client::lazy_channel;
use latchkey_shared::tls::ClientTls;
use latchkey_shared::{ApiError, ErrorCode, KeyRange, Retry};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;
use tonic::transport::Channel;

/// Where a call is served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// The leader when known (writes, linearizable reads, membership).
    Leader,
    /// Any member, in turn (serializable reads).
    Any,
}

/// What a call does, which decides whether an unknown outcome may be
/// retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Changes nothing: may be sent again whatever happened.
    Read,
    /// May change the cell: sent again only when it surely did not arrive.
    Write,
}

/// First pause between attempts; doubled each time, up to
/// [`MAX_BACKOFF`]. An election takes 1-2 s, a NotLeader hint is good at
/// once, so the first retry is quick and later ones wait for the election.
const FIRST_BACKOFF: Duration = Duration::from_millis(20);
const MAX_BACKOFF: Duration = Duration::from_millis(400);

/// One member of the cell as the proxy sees it.
pub struct Member {
    /// As given in `--cells`.
    pub addr: String,
    /// Connects lazily and reconnects by itself.
    pub channel: Channel,
    /// The member id answering at `addr` (0 until learned from a header).
    member_id: AtomicU64,
    /// False after a failed call or status probe, until one succeeds.
    up: AtomicBool,
}

impl Member {
    pub fn member_id(&self) -> Option<u64> {
        match self.member_id.load(Ordering::Relaxed) {
            0 => None,
            id => Some(id),
        }
    }

    pub fn is_up(&self) -> bool {
        self.up.load(Ordering::Relaxed)
    }

    pub(crate) fn learned(&self, member_id: u64) {
        if member_id != 0 {
            self.member_id.store(member_id, Ordering::Relaxed);
        }
        self.up.store(true, Ordering::Relaxed);
    }

    pub(crate) fn failed(&self) {
        self.up.store(false, Ordering::Relaxed);
    }
}

/// Unknown leader in [`CellClient::leader`].
const NO_LEADER: usize = usize::MAX;

/// The channels to one cell's members; see the module doc.
pub struct CellClient {
    pub members: Vec<Member>,
    /// Index into `members` of the leader, or [`NO_LEADER`].
    leader: AtomicUsize,
    /// Round-robin position for [`Route::Any`].
    next: AtomicUsize,
    /// The cell's id (etcd's cluster id), 0 until learned.
    cell_id: AtomicU64,
    /// The newest header any member sent, for answers the proxy makes
    /// itself (keep-alives).
    last_header: Mutex<PbResponseHeader>,
    /// Wakes the leader tracker early (a call met a leader change).
    pub(crate) leader_changed: Notify,
    pub request_timeout: Duration,
    /// What the proxy presents for its own calls (`--cell-user`), kept
    /// fresh by `upstream::identity`.
    pub own_credentials: OwnCredentials,
    /// Whether the cell had authentication on when last asked:
    /// [`AUTH_UNKNOWN`] until it answers.
    auth: AtomicU8,
    /// The cell's auth version when last asked (0 until it answers):
    /// what the proxy's shared watches are checked again on.
    auth_revision: tokio::sync::watch::Sender<u64>,
    /// Client tokens the cell accepted while authentication was on.
    pub accepted_tokens: AcceptedTokens,
    /// Whether the proxy's own identity here is settled: true unless a
    /// `upstream::identity` task runs for the cell and has not yet learned
    /// whether authentication is on (and, when it is and the proxy has a
    /// user, authenticated). The proxy's own calls wait for it, within
    /// [`IDENTITY_WAIT`], so a cell's client made for a directory change
    /// does not send its first calls before it has a token.
    identity_settled: tokio::sync::watch::Sender<bool>,
}

/// How long the proxy's own calls wait for its identity in a cell to be
/// settled before they go without (and are refused if a token was due).
const IDENTITY_WAIT: Duration = Duration::from_secs(2);

const AUTH_UNKNOWN: u8 = 0;
const AUTH_OFF: u8 = 1;
const AUTH_ON: u8 = 2;

/// Whether the cell checks the caller's token on `path` with
/// authentication on: a call there that succeeds vouches for its token.
/// (Status, MemberList, AuthStatus and Authenticate answer anyone.)
fn authenticates(path: &str) -> bool {
    use latchkey_shared::etcd_methods::{auth, kv, lease};
    [
        kv::RANGE,
        kv::PUT,
        kv::DELETE_RANGE,
        kv::TXN,
        lease::GRANT,
        lease::REVOKE,
        auth::USER_GET,
    ]
    .contains(&path)
}

/// Whose identity a call carries.
#[derive(Debug, Clone, Copy)]
pub enum Who<'a> {
    /// The proxy's own (its records, shared watches, refresh batches).
    Proxy,
    /// A client's, on a call made on its behalf: its token, or none at
    /// all, never the proxy's.
    Client(Option<&'a str>),
}

impl CellClient {
    /// Channels to `addrs` (client addresses of one cell's members), over
    /// TLS with `tls` when given. Nothing is connected until the first
    /// call.
    pub fn new(
        addrs: &[String],
        request_timeout: Duration,
        tls: Option<&ClientTls>,
    ) -> Result<CellClient, ApiError> {
        if addrs.is_empty() {
            return Err(ApiError::invalid("no cell member address given"));
        }
        let members = addrs
            .iter()
            .map(|addr| {
                let endpoint = endpoint(addr).map_err(|e| ApiError::invalid(e.to_string()))?;
                let channel = lazy_channel(&endpoint, tls, None);
                Ok(Member {
                    addr: addr.clone(),
                    channel,
                    member_id: AtomicU64::new(0),
                    up: AtomicBool::new(true),
                })
            })
            .collect::<Result<Vec<_>, ApiError>>()?;
        Ok(CellClient {
            members,
            leader: AtomicUsize::new(NO_LEADER),
            next: AtomicUsize::new(0),
            cell_id: AtomicU64::new(0),
            last_header: Mutex::new(PbResponseHeader::default()),
            leader_changed: Notify::new(),
            request_timeout,
            own_credentials: OwnCredentials::default(),
            auth: AtomicU8::new(AUTH_UNKNOWN),
            auth_revision: tokio::sync::watch::Sender::new(0),
            accepted_tokens: AcceptedTokens::default(),
            identity_settled: tokio::sync::watch::Sender::new(true),
        })
    }

    /// An identity task starts for the cell: the proxy's own calls wait
    /// for [`settle_identity`](Self::settle_identity).
    pub fn unsettle_identity(&self) {
        self.identity_settled.send_replace(false);
    }

    /// The identity task has learned whether authentication is on and, if
    /// it is, tried to authenticate.
    pub fn settle_identity(&self) {
        self.identity_settled.send_replace(true);
    }

    /// Waits (within [`IDENTITY_WAIT`]) until the proxy's identity here is
    /// settled.
    async fn identity(&self) {
        // Settled once and for good: every call after the first ones
        // passes here without a subscription or a timer.
        if *self.identity_settled.borrow() {
            return;
        }
        let mut settled = self.identity_settled.subscribe();
        let wait = IDENTITY_WAIT.min(self.request_timeout);
        let _ = tokio::time::timeout(wait, settled.wait_for(|s| *s)).await;
    }

    /// Whether the cell may have authentication on: it said so when last
    /// asked (every second, by `upstream::identity`), or it has not
    /// answered yet. Then the proxy checks a client's permission with the
    /// cell before it acts for the client with its own identity.
    pub fn auth_may_be_on(&self) -> bool {
        self.auth.load(Ordering::Relaxed) != AUTH_OFF
    }

    /// Whether the cell said authentication is on when last asked.
    pub fn auth_known_on(&self) -> bool {
        self.auth.load(Ordering::Relaxed) == AUTH_ON
    }

    /// What the cell answered to AuthStatus: whether authentication is
    /// on, and its auth version (the revision of the last auth change).
    /// An answer older than the version already known (a member behind
    /// the others) changes nothing: the switch and the version move
    /// together, under the version's lock.
    pub(crate) fn set_auth_status(&self, on: bool, revision: u64) {
        let rose = self.auth_revision.send_if_modified(|known| {
            if revision < *known {
                return false;
            }
            let value = if on { AUTH_ON } else { AUTH_OFF };
            self.auth.store(value, Ordering::Relaxed);
            let newer = revision > *known;
            *known = revision;
            newer
        });
        if rose {
            self.accepted_tokens.forget_all();
        }
    }

    /// The cell's auth version as last answered: every auth change
    /// (users, roles, permissions, on and off) raises it.
    pub fn auth_revision(&self) -> u64 {
        *self.auth_revision.borrow()
    }

    /// Wakes on each rise of [`auth_revision`](Self::auth_revision).
    pub fn watch_auth_revision(&self) -> tokio::sync::watch::Receiver<u64> {
        self.auth_revision.subscribe()
    }

    /// The cell's id once any member has answered.
    pub fn cell_id(&self) -> Option<u64> {
        match self.cell_id.load(Ordering::Relaxed) {
            0 => None,
            id => Some(id),
        }
    }

    /// The leader's index in `members`, when known.
    pub fn leader(&self) -> Option<usize> {
        match self.leader.load(Ordering::Relaxed) {
            NO_LEADER => None,
            i => Some(i),
        }
    }

    /// Records the leader by its member id; unknown ids clear it.
    pub(crate) fn set_leader(&self, member_id: Option<u64>) {
        let index = member_id
            .and_then(|id| self.members.iter().position(|m| m.member_id() == Some(id)))
            .unwrap_or(NO_LEADER);
        self.leader.store(index, Ordering::Relaxed);
    }

    /// Notes a header a member answered with.
    pub(crate) fn saw_header(&self, member: usize, header: Option<&PbResponseHeader>) {
        let Some(header) = header else { return };
        if let Some(m) = self.members.get(member) {
            m.learned(header.member_id);
        }
        if header.cluster_id != 0 {
            self.cell_id.store(header.cluster_id, Ordering::Relaxed);
        }
        // The std mutex is held for a copy only, never across an await.
        if let Ok(mut last) = self.last_header.lock() {
            if header.revision >= last.revision {
                *last = *header;
            }
        }
    }

    /// The newest header seen (revision, term, cell and member ids).
    pub fn last_header(&self) -> PbResponseHeader {
        self.last_header.lock().map(|h| *h).unwrap_or_default()
    }

    /// The member to try on attempt `attempt` of a call on `route`.
    pub(crate) fn pick(&self, route: Route, attempt: usize) -> usize {
        let n = self.members.len();
        if route == Route::Leader {
            if let Some(leader) = self.leader() {
                // The leader first, then the others in turn: one that is
                // not the leader forwards, or names who is.
                return (leader + attempt) % n;
            }
        }
        // In turn, skipping members that failed last time (all of them, if
        // every member failed: a failed member may be back).
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        (0..n)
            .map(|k| (start + k) % n)
            .find(|&i| self.members[i].is_up())
            .unwrap_or(start % n)
    }

    /// Sends `request` to `path` on the member `route` names, as the
    /// proxy itself, retrying by the rules of the module doc until
    /// `request_timeout` has passed.
    pub async fn call<Req, Resp>(
        &self,
        route: Route,
        kind: Kind,
        path: &'static str,
        request: Req,
    ) -> Result<Resp, ApiError>
    where
        Req: prost::Message + Clone + Send + Sync + 'static,
        Resp: prost::Message + Default + Send + Sync + HasHeader + 'static,
    {
        self.call_as(Who::Proxy, route, kind, path, request).await
    }

    /// Every live key of `range` at one revision (linearizable, as the
    /// proxy), read [`READ_ALL_PAGE`] keys at a time, with that revision.
    pub async fn read_all(&self, range: &KeyRange) -> Result<(Vec<PbKeyValue>, i64), ApiError> {
        let mut pages = self.pages(range);
        let mut kvs = Vec::new();
        while let Some(page) = pages.next().await? {
            kvs.extend(page);
        }
        Ok((kvs, pages.revision()))
    }

    /// The live keys of `range` at one revision, [`READ_ALL_PAGE`] at a
    /// time: what a caller that handles each page before the next holds
    /// in memory is one page.
    pub fn pages<'a>(&'a self, range: &KeyRange) -> Pages<'a> {
        Pages {
            cell: self,
            start: range.start.clone(),
            end: range.end.clone(),
            at: 0,
            done: false,
        }
    }

    /// [`call`](Self::call) with `who`'s identity.
    pub async fn call_as<Req, Resp>(
        &self,
        who: Who<'_>,
        route: Route,
        kind: Kind,
        path: &'static str,
        request: Req,
    ) -> Result<Resp, ApiError>
    where
        Req: prost::Message + Clone + Send + Sync + 'static,
        Resp: prost::Message + Default + Send + Sync + HasHeader + 'static,
    {
        let started = Instant::now();
        // A client's token joined for several cells: this cell's part.
        let who = match who {
            Who::Client(Some(token)) => {
                Who::Client(Some(super::cell_tokens::for_cell(token, self.cell_id())))
            }
            other => other,
        };
        let needs_identity = !matches!(
            path,
            latchkey_shared::etcd_methods::auth::AUTH_STATUS
                | latchkey_shared::etcd_methods::auth::AUTHENTICATE
        );
        if matches!(who, Who::Proxy) && needs_identity {
            self.identity().await;
        }
        let result = self
            .retrying(route, kind, path, |member, deadline| {
                let channel = self.members[member].channel.clone();
                let mut grpc_request = tonic::Request::new(request.clone());
                grpc_request.set_timeout(deadline.saturating_duration_since(Instant::now()));
                match who {
                    Who::Proxy => self.own_credentials.attach(&mut grpc_request),
                    Who::Client(token) => attach_client_token(&mut grpc_request, token),
                }
                async move {
                    let resp = call::unary::<Req, Resp>(channel, path, grpc_request).await?;
                    self.saw_header(member, resp.header());
                    Ok(resp)
                }
            })
            .await;
        metrics::histogram!(UPSTREAM_SECONDS.name, "path" => path)
            .record(started.elapsed().as_secs_f64());
        if let (Ok(resp), Who::Client(Some(token))) = (&result, who) {
            // Only from a member that has applied the newest auth change
            // the proxy knows of (one behind it may not check tokens yet).
            let current = resp
                .header()
                .is_some_and(|h| h.revision >= self.auth_revision() as i64);
            if self.auth_known_on() && authenticates(path) && current {
                self.accepted_tokens.remember(token);
            }
        }
        result
    }

    /// Runs `attempt(member, deadline)` on the member `route` names, and
    /// again on the next one while the error's retry class allows it (a
    /// read may also retry an unknown outcome), with backoff, until
    /// `request_timeout` has passed. THE retry loop: unary calls and the
    /// watch streams the coalescer opens both go through it.
    pub async fn retrying<T, F, Fut>(
        &self,
        route: Route,
        kind: Kind,
        what: &'static str,
        mut attempt: F,
    ) -> Result<T, ApiError>
    where
        F: FnMut(usize, Instant) -> Fut,
        Fut: std::future::Future<Output = Result<T, ApiError>>,
    {
        let deadline = Instant::now() + self.request_timeout;
        let mut backoff = FIRST_BACKOFF;
        let mut tries = 0;
        loop {
            let member = self.pick(route, tries);
            tries += 1;
            let error = match tokio::time::timeout_at(deadline, attempt(member, deadline)).await {
                Ok(Ok(value)) => return Ok(value),
                Ok(Err(e)) => e,
                Err(_) => return Err(ApiError::timeout()),
            };
            metrics::counter!(UPSTREAM_ERRORS.name, "code" => error.code.as_str()).increment(1);
            if !self.may_retry(member, kind, &error) {
                return Err(error);
            }
            let pause = backoff.min(deadline.saturating_duration_since(Instant::now()));
            if pause.is_zero() {
                return Err(error);
            }
            tracing::debug!(what, member = %self.members[member].addr, error = %error, "retrying");
            tokio::time::sleep(pause).await;
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }

    /// Whether a failed attempt on `member` may be made again, learning
    /// what the error says about the leader on the way.
    fn may_retry(&self, member: usize, kind: Kind, error: &ApiError) -> bool {
        match error.code {
            ErrorCode::NotLeader => {
                self.set_leader(error.leader_hint());
                self.leader_changed.notify_one();
            }
            // This member has no leader, so it serves nothing fresh; the
            // others may well have one.
            ErrorCode::NoLeader => {
                self.members[member].failed();
                if self.leader() == Some(member) {
                    self.set_leader(None);
                    self.leader_changed.notify_one();
                }
            }
            _ => {}
        }
        if error.is_member_fault() || error.code == ErrorCode::Unavailable {
            self.members[member].failed();
            if self.leader() == Some(member) {
                self.set_leader(None);
                self.leader_changed.notify_one();
            }
        }
        match error.retry() {
            Retry::Safe => true,
            Retry::OutcomeUnknown => kind == Kind::Read || broken(Defect::RetryAmbiguousWrites),
            Retry::Never => false,
        }
    }
}

/// Keys per page of [`CellClient::read_all`].
pub const READ_ALL_PAGE: i64 = 1000;

/// [`CellClient::pages`]: the pages of a range at the revision of the
/// first (linearizable, as the proxy).
pub struct Pages<'a> {
    cell: &'a CellClient,
    start: Vec<u8>,
    end: Vec<u8>,
    /// The revision every page is read at (0 until the first).
    at: i64,
    done: bool,
}

impl Pages<'_> {
    /// The next page, or `None` after the last.
    pub async fn next(&mut self) -> Result<Option<Vec<PbKeyValue>>, ApiError> {
        if self.done {
            return Ok(None);
        }
        let page: PbRangeResponse = self
            .cell
            .call(
                Route::Leader,
                Kind::Read,
                latchkey_shared::etcd_methods::kv::RANGE,
                PbRangeRequest {
                    key: self.start.clone(),
                    range_end: self.end.clone(),
                    limit: READ_ALL_PAGE,
                    revision: self.at,
                    ..Default::default()
                },
            )
            .await?;
        if self.at == 0 {
            self.at = page.header.map_or(0, |h| h.revision);
        }
        self.done = !page.more;
        if let Some(last) = page.kvs.last() {
            self.start = [last.key.as_slice(), &[0]].concat();
        }
        Ok(Some(page.kvs))
    }

    /// The revision the pages are read at (0 before the first).
    pub fn revision(&self) -> i64 {
        self.at
    }
}

/// An etcd response with a header (every one but a stream's later
/// messages), so the proxy learns member ids, the cell id and revisions
/// from whatever it forwards.
pub trait HasHeader {
    fn header(&self) -> Option<&PbResponseHeader>;
}

macro_rules! has_header {
    ($($t:ty),* $(,)?) => {
        $(impl HasHeader for $t {
            fn header(&self) -> Option<&PbResponseHeader> {
                self.header.as_ref()
            }
        })*
    };
}

use latchkey_shared::etcdpb::*;
has_header!(
    PbRangeResponse,
    PbPutResponse,
    PbDeleteResponse,
    PbTxnResponse,
    PbCompactionResponse,
    PbLeaseGrantResponse,
    PbLeaseRevokeResponse,
    PbLeaseTimeToLiveResponse,
    PbLeaseLeasesResponse,
    PbMemberAddResponse,
    PbMemberRemoveResponse,
    PbMemberUpdateResponse,
    PbMemberListResponse,
    PbMemberPromoteResponse,
    PbAlarmResponse,
    PbStatusResponse,
    PbDefragmentResponse,
    PbHashResponse,
    PbHashKvResponse,
    PbMoveLeaderResponse,
    PbDowngradeResponse,
);

use latchkey_shared::tenants_pb as tenants;
has_header!(
    tenants::TenantPutResponse,
    tenants::TenantGetResponse,
    tenants::TenantListResponse,
    tenants::TenantDeleteResponse,
);

has_header!(latchkey_shared::proxy_auth_pb::CheckReadsResponse);
has_header!(latchkey_shared::moves_pb::RaiseRevisionResponse);
has_header!(latchkey_shared::moves_pb::ImportResponse);

use latchkey_shared::auth_pb as auth;
has_header!(
    auth::AuthEnableResponse,
    auth::AuthDisableResponse,
    auth::AuthStatusResponse,
    auth::AuthenticateResponse,
    auth::AuthUserAddResponse,
    auth::AuthUserGetResponse,
    auth::AuthUserListResponse,
    auth::AuthUserDeleteResponse,
    auth::AuthUserChangePasswordResponse,
    auth::AuthUserGrantRoleResponse,
    auth::AuthUserRevokeRoleResponse,
    auth::AuthRoleAddResponse,
    auth::AuthRoleGetResponse,
    auth::AuthRoleListResponse,
    auth::AuthRoleDeleteResponse,
    auth::AuthRoleGrantPermissionResponse,
    auth::AuthRoleRevokePermissionResponse,
);

/// Shared by the services of both APIs.
pub type Cell = Arc<CellClient>;
