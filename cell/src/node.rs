//! A running member of a cell: its identity, its Raft handle and applied
//! state, and the rule for where each request is served.
//!
//! Any member accepts any request. Writes, linearizable reads (their read
//! index), keep-alives, time-to-live and membership changes are served by
//! the leader: a follower forwards them (see `crate::peer`). While there is
//! no leader a request waits up to the request timeout, then fails
//! `no_leader`. A forwarded request is sent again after a leader change
//! only when the first attempt provably never arrived, or when serving it
//! twice is harmless.

use crate::batching::{self, Batcher};
use crate::config::{Limits, Resolved};
use crate::lease::leader_leases::{LeaderLeases, LeaseTtl};
use crate::lease::lessor::Lessor;
use crate::membership::Membership;
use crate::metrics_catalog::{
    FORWARDED_KEEP_ALIVES, FORWARDED_KEEP_ALIVE_BATCHES, LEASE_KEEPALIVES, PROPOSAL_COMMIT_SECONDS,
    REFRESH_BATCHES, REFRESH_BATCH_LEASES,
};
use crate::peer::client::{leader, send_to_leader, PeerClients};
use crate::peer::protocol::{Forward, ForwardHandler, ForwardReply, MembershipChange};
use crate::raft::command::{Request, Response};
use crate::raft::leader_contact::LeaderContact;
use crate::raft::leadership::leads_with_quorum;
use crate::raft::proposer::{Committed, Proposer};
use crate::raft::read_index::{ReadIndex, SharedRounds};
use crate::raft::{errors, NodeId, Raft};
use crate::state_machine::store::SharedState;
use crate::state_machine::watch_hub::WatchHub;
use latchkey_shared::etcdpb::PbResponseHeader;
use latchkey_shared::lease_id::LeaseId;
use latchkey_shared::lifecycle::Lifecycle;
use latchkey_shared::ApiError;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// How long to wait after a `not_leader` answer before looking for the
/// leader again: about one heartbeat, so the new leader is usually known.
const LEADER_RETRY: Duration = Duration::from_millis(50);

/// One member, shared by its servers and background jobs.
pub struct CellNode {
    pub id: NodeId,
    pub cluster_id: u64,
    pub name: String,
    /// `https://` once the client port has TLS, as etcd advertises it.
    pub client_url: String,
    /// `https` once the peer port has TLS: the scheme of the peer URLs
    /// the Cluster API reports.
    pub peer_url_scheme: &'static str,
    pub raft: Raft,
    pub state: SharedState,
    pub watch_hub: Arc<WatchHub>,
    /// The log store's database, for maintenance.
    pub db: Arc<rocksdb::DB>,
    pub limits: Limits,
    pub request_timeout: Duration,
    pub election_timeout: Duration,
    /// See `Resolved::quorum_timeout`.
    pub quorum_timeout: Duration,
    /// How long a leader was last heard from, for require-leader streams.
    pub leader_contact: Arc<LeaderContact>,
    /// A require-leader stream ends once this member has gone this long
    /// without a leader: two election timeouts.
    pub require_leader_after: Duration,
    /// Owns every task serving this member's clients.
    pub lifecycle: Lifecycle,
    /// Leadership confirmations, shared by reads and lease refreshes.
    read_index: Arc<ReadIndex>,
    /// Read indexes asked of the leader (wherever it is), shared by this
    /// member's linearizable reads: one request at a time.
    barrier_rounds: SharedRounds,
    leases: LeaderLeases,
    /// Group commit of this member's proposals while it leads.
    proposer: Proposer,
    /// Writes on their way to the leader from this member while it
    /// follows: concurrent ones travel in one message.
    forwarder: Batcher<Request, Committed>,
    /// Keep-alives on their way to the leader from this member while it
    /// follows: concurrent ones travel as one refresh batch.
    keep_alive_forwarder: Batcher<i64, Result<i64, ApiError>>,
    peers: PeerClients,
}

impl CellNode {
    pub fn new(
        cfg: &Resolved,
        raft: Raft,
        state: SharedState,
        lessor: Arc<Lessor>,
        watch_hub: Arc<WatchHub>,
        db: Arc<rocksdb::DB>,
        peers: PeerClients,
    ) -> Self {
        let request_timeout = cfg.request_timeout();
        let read_index = Arc::new(ReadIndex::new(raft.clone()));
        let lifecycle = Lifecycle::new();
        let limits = cfg.limits();
        let proposer = Proposer::start(
            raft.clone(),
            &lifecycle,
            limits.max_request_bytes,
            request_timeout,
        );
        let forwarder =
            start_forwarder(cfg.id, &raft, &peers, &lifecycle, &limits, request_timeout);
        let keep_alive_forwarder =
            start_keep_alive_forwarder(cfg.id, &raft, &peers, &lifecycle, request_timeout);
        CellNode {
            id: cfg.id,
            cluster_id: cfg.cluster_id,
            name: cfg.name.clone(),
            client_url: format!(
                "{}://{}",
                scheme(cfg.cfg.tls.files().is_some()),
                cfg.cfg.advertised_client_addr()
            ),
            peer_url_scheme: scheme(cfg.cfg.peer_tls.server_files().is_some()),
            leases: LeaderLeases {
                id: cfg.id,
                raft: raft.clone(),
                state: state.clone(),
                lessor,
                read_index: read_index.clone(),
                request_timeout,
                confirm_timeout: cfg.election_timeout(),
            },
            raft,
            state,
            watch_hub,
            db,
            limits,
            request_timeout,
            election_timeout: cfg.election_timeout(),
            quorum_timeout: cfg.quorum_timeout(),
            leader_contact: Arc::new(LeaderContact::default()),
            require_leader_after: cfg.election_timeout() * 2,
            lifecycle,
            read_index,
            barrier_rounds: SharedRounds::default(),
            proposer,
            forwarder,
            keep_alive_forwarder,
            peers,
        }
    }

    /// The response header every etcd response carries.
    pub fn header(&self, revision: i64) -> PbResponseHeader {
        let term = self.raft.metrics().borrow().current_term;
        PbResponseHeader {
            cluster_id: self.cluster_id,
            member_id: self.id,
            revision,
            raft_term: term,
        }
    }

    /// A header with the current applied revision.
    pub fn header_now(&self) -> PbResponseHeader {
        self.header(self.state.read(|s| s.keys.revision()))
    }

    /// Whether this member leads and has heard from a quorum within the
    /// quorum timeout (check-quorum).
    pub fn is_leader(&self) -> bool {
        leads_with_quorum(&self.raft.metrics().borrow(), self.id, self.quorum_timeout)
    }

    /// Whether this member has gone without a leader for longer than
    /// [`require_leader_after`](Self::require_leader_after): it leads
    /// without a quorum's acknowledgement, or it has not heard a leader.
    pub fn leader_lost(&self) -> bool {
        let silence = self
            .leader_contact
            .silence(&self.raft.metrics().borrow(), self.id);
        silence > self.require_leader_after
    }

    pub fn membership(&self) -> Membership<'_> {
        Membership {
            id: self.id,
            raft: &self.raft,
            peers: &self.peers,
            request_timeout: self.request_timeout,
            election_timeout: self.election_timeout,
        }
    }

    /// Runs `req` on the leader: here when this member leads, else over the
    /// peer service, following leader changes until the request timeout.
    async fn on_leader(&self, req: Forward) -> Result<ForwardReply, ApiError> {
        let deadline = Instant::now() + self.request_timeout;
        loop {
            let (leader, addr) = leader(&self.raft, deadline).await?;
            let here = leader == self.id;
            let result = if here {
                tokio::time::timeout_at(deadline, self.serve_forwarded(&req))
                    .await
                    .unwrap_or_else(|_| Err(ApiError::timeout()))
            } else {
                send_to_leader(&self.raft, &self.peers, (leader, &addr), &req, deadline).await
            };
            let resend = result
                .as_ref()
                .is_err_and(|e| req.may_resend_after(e, here));
            if !resend || Instant::now() >= deadline {
                return result;
            }
            tokio::time::sleep(
                LEADER_RETRY.min(deadline.saturating_duration_since(Instant::now())),
            )
            .await;
        }
    }

    /// Checks limits that depend on the current state, then proposes.
    /// Answers once the entry is applied here (the leader), with its index.
    async fn propose(&self, req: Request) -> Committed {
        self.check_quota(&req)?;
        let started = Instant::now();
        let result = self.proposer.propose(req).await;
        if result.is_ok() {
            crate::crash_point!(crate::chaos::COMMITTED_BEFORE_ANSWER);
        }
        metrics::histogram!(PROPOSAL_COMMIT_SECONDS.name).record(started.elapsed().as_secs_f64());
        result
    }

    fn check_quota(&self, req: &Request) -> Result<(), ApiError> {
        let added = req.added_bytes();
        let used = self.state.read(|s| s.keys.bytes());
        if added > 0 && used + added > self.limits.quota_bytes {
            return Err(ApiError::quota_exceeded(format!(
                "keyspace holds {used} bytes; quota is {} bytes",
                self.limits.quota_bytes
            )));
        }
        Ok(())
    }

    /// A replicated write, wherever it arrives. Answered once this member
    /// has applied it too, so the client's next read here sees it (a
    /// follower a moment behind the leader would not yet; found by the etcd
    /// client suite: a progress notification on the follower carried a
    /// revision older than the client's own put). If this member does not
    /// catch up within the request timeout, the answer is a timeout, as in
    /// etcd: the write is committed, but this member cannot show it.
    pub async fn write(&self, req: Request) -> Result<Response, ApiError> {
        let started = Instant::now();
        let (index, response) = tokio::time::timeout(self.request_timeout, self.commit(req))
            .await
            .unwrap_or_else(|_| Err(ApiError::timeout()))?;
        let left = self.request_timeout.saturating_sub(started.elapsed());
        match tokio::time::timeout(left, self.state.wait_applied(index)).await {
            Ok(true) => Ok(response),
            Ok(false) => Err(errors::fatal("the state machine stopped")),
            Err(_) => Err(ApiError::timeout()),
        }
    }

    /// Commits `req` on the leader: proposed here when this member leads,
    /// else forwarded (with the writes that go at the same time), following
    /// leader changes as [`Self::on_leader`] does.
    async fn commit(&self, req: Request) -> Committed {
        loop {
            let here = self.raft.metrics().borrow().current_leader == Some(self.id);
            let result = if here {
                self.propose(req.clone()).await
            } else {
                self.forwarder
                    .submit(req.clone())
                    .await
                    .unwrap_or_else(|| Err(errors::fatal("the forwarder stopped")))
            };
            let resend = result
                .as_ref()
                .is_err_and(|e| Forward::Write(req.clone()).may_resend_after(e, here));
            if !resend {
                return result;
            }
            tokio::time::sleep(LEADER_RETRY).await;
        }
    }

    /// Waits until this member's state reflects every write acknowledged
    /// before the call: the read index, with no log write. Concurrent
    /// reads on this member share one request to the leader (etcd's
    /// linearizable read loop), so a follower does not forward one per read.
    pub async fn linearizable_barrier(&self) -> Result<(), ApiError> {
        // Rounds go one at a time: a read queued behind rounds that each
        // wait out the request timeout (no leader) would otherwise wait for
        // all of them. A lone read's own round and apply wait fit in twice
        // the request timeout, with their own errors.
        tokio::time::timeout(2 * self.request_timeout, self.barrier())
            .await
            .unwrap_or_else(|_| Err(ApiError::timeout()))
    }

    async fn barrier(&self) -> Result<(), ApiError> {
        use crate::chaos::{broken, Break};
        if broken(Break::FollowerLocalReads) || broken(Break::LeaderLocalReads) {
            let leads = self.raft.metrics().borrow().current_leader == Some(self.id);
            if broken(if leads {
                Break::LeaderLocalReads
            } else {
                Break::FollowerLocalReads
            }) {
                return Ok(());
            }
        }
        let confirmed = self
            .barrier_rounds
            .join(|| async {
                match self.on_leader(Forward::ReadIndex).await? {
                    ForwardReply::ReadIndex(i) => Ok(i),
                    other => Err(unexpected(other)),
                }
            })
            .await?;
        let index = confirmed.index;
        match tokio::time::timeout(self.request_timeout, self.state.wait_applied(index)).await {
            Ok(true) => Ok(()),
            Ok(false) => Err(errors::fatal("the state machine stopped")),
            Err(_) => Err(ApiError::timeout()),
        }
    }

    /// A keep-alive, wherever it arrives: returns the lease's TTL. On a
    /// follower it goes to the leader with the keep-alives that go at the
    /// same time, in one refresh batch: one peer call per batch rather than
    /// one per keep-alive.
    pub async fn keep_alive(&self, id: i64) -> Result<i64, ApiError> {
        metrics::counter!(LEASE_KEEPALIVES.name).increment(1);
        let deadline = Instant::now() + self.request_timeout;
        loop {
            let here = self.raft.metrics().borrow().current_leader == Some(self.id);
            let result = if here {
                self.on_leader(Forward::KeepAlive { id })
                    .await
                    .and_then(|reply| match reply {
                        ForwardReply::KeepAlive { ttl } => Ok(ttl),
                        other => Err(unexpected(other)),
                    })
            } else {
                tokio::time::timeout_at(deadline, self.keep_alive_forwarder.submit(id))
                    .await
                    .unwrap_or_else(|_| Some(Err(ApiError::timeout())))
                    .unwrap_or_else(|| Err(errors::fatal("the forwarder stopped")))
            };
            let resend = result
                .as_ref()
                .is_err_and(|e| Forward::KeepAlive { id }.may_resend_after(e, here));
            if !resend || Instant::now() >= deadline {
                return result;
            }
            tokio::time::sleep(
                LEADER_RETRY.min(deadline.saturating_duration_since(Instant::now())),
            )
            .await;
        }
    }

    /// Refreshes many leases in one round trip to the leader, wherever it
    /// arrives: per id its TTL, or -1 if the lease does not exist.
    pub async fn refresh_batch(&self, ids: Vec<i64>) -> Result<Vec<i64>, ApiError> {
        let count = ids.len() as u64;
        match self.on_leader(Forward::RefreshBatch { ids }).await? {
            ForwardReply::Refreshed { ttls } => {
                metrics::counter!(REFRESH_BATCHES.name).increment(1);
                metrics::counter!(REFRESH_BATCH_LEASES.name).increment(count);
                Ok(ttls)
            }
            other => Err(unexpected(other)),
        }
    }

    pub async fn time_to_live(&self, id: i64) -> Result<LeaseTtl, ApiError> {
        match self.on_leader(Forward::TimeToLive { id }).await? {
            ForwardReply::TimeToLive(t) => Ok(t),
            other => Err(unexpected(other)),
        }
    }

    /// A membership change, wherever it arrives.
    pub async fn change_membership(&self, change: MembershipChange) -> Result<(), ApiError> {
        self.on_leader(Forward::Membership(change))
            .await
            .map(|_| ())
    }

    /// Moves leadership to voter `target`, wherever the request arrives.
    pub async fn move_leader(&self, target: NodeId) -> Result<(), ApiError> {
        self.on_leader(Forward::MoveLeader { target })
            .await
            .map(|_| ())
    }
}

fn unexpected(reply: ForwardReply) -> ApiError {
    ApiError::internal(format!("unexpected reply {reply:?}"))
}

impl ForwardHandler for CellNode {
    /// Serves a forwarded request on this member, which must lead.
    fn serve_forwarded<'a>(
        &'a self,
        req: &'a Forward,
    ) -> impl Future<Output = Result<ForwardReply, ApiError>> + Send + 'a {
        async move {
            match req {
                Forward::Write(r) => self
                    .propose(r.clone())
                    .await
                    .map(|(index, response)| ForwardReply::Written { index, response }),
                Forward::Writes(writes) => Ok(ForwardReply::WrittenMany(
                    futures::future::join_all(writes.iter().map(|w| self.propose(w.clone()))).await,
                )),
                Forward::ReadIndex => self
                    .read_index
                    .confirm()
                    .await
                    .map(|c| ForwardReply::ReadIndex(c.index)),
                Forward::KeepAlive { id } => self
                    .leases
                    .refresh(*id)
                    .await
                    .map(|ttl| ForwardReply::KeepAlive { ttl }),
                Forward::RefreshBatch { ids } => self
                    .leases
                    .refresh_batch(ids)
                    .await
                    .map(|ttls| ForwardReply::Refreshed { ttls }),
                Forward::TimeToLive { id } => self
                    .leases
                    .time_to_live(*id)
                    .await
                    .map(ForwardReply::TimeToLive),
                Forward::Membership(change) => self
                    .membership()
                    .change(change)
                    .await
                    .map(|_| ForwardReply::Done),
                Forward::MoveLeader { target } => self
                    .membership()
                    .move_leader(*target)
                    .await
                    .map(|_| ForwardReply::Done),
                Forward::CommittedMembership => Ok(self.membership().committed()),
                Forward::Campaign => {
                    self.raft.trigger().elect().await.map_err(errors::fatal)?;
                    Ok(ForwardReply::Done)
                }
            }
        }
    }
}

/// The leader a follower's forwarded group goes to; `not_leader` when it
/// is this member (the group is then served here).
async fn other_leader(
    id: NodeId,
    raft: &Raft,
    deadline: Instant,
) -> Result<(NodeId, String), ApiError> {
    let (leader, addr) = leader(raft, deadline).await?;
    if leader == id {
        return Err(ApiError::not_leader(Some(id)));
    }
    Ok((leader, addr))
}

/// The follower's side of group commit: concurrent writes go to the leader
/// in one `Forward::Writes`. A group that finds this member leading is
/// answered `not_leader`, and each write is then proposed here.
fn start_forwarder(
    id: NodeId,
    raft: &Raft,
    peers: &PeerClients,
    lifecycle: &Lifecycle,
    limits: &Limits,
    request_timeout: Duration,
) -> Batcher<Request, Committed> {
    let (raft, peers) = (raft.clone(), peers.clone());
    let limits = batching::Limits {
        in_flight: FORWARDS_IN_FLIGHT,
        max_items: MAX_FORWARDED_WRITES,
        max_bytes: limits.max_request_bytes,
    };
    Batcher::start(
        lifecycle,
        limits,
        Request::size_hint,
        move |writes: Vec<Request>| {
            let (raft, peers) = (raft.clone(), peers.clone());
            async move {
                let count = writes.len();
                let deadline = Instant::now() + request_timeout;
                let (leader, addr) = match other_leader(id, &raft, deadline).await {
                    Ok(found) => found,
                    Err(e) => return vec![Err(e); count],
                };
                let req = Forward::Writes(writes);
                match send_to_leader(&raft, &peers, (leader, &addr), &req, deadline).await {
                    Ok(ForwardReply::WrittenMany(answers)) if answers.len() == count => answers,
                    Ok(other) => vec![Err(unexpected(other)); count],
                    Err(e) => vec![Err(e); count],
                }
            }
        },
    )
}

/// The follower's side of keep-alives: those that arrive while earlier
/// ones are on their way go to the leader as one `Forward::RefreshBatch`
/// (what a proxy sends once per tick). A group that finds this member
/// leading is answered `not_leader`, and each is then served here.
fn start_keep_alive_forwarder(
    id: NodeId,
    raft: &Raft,
    peers: &PeerClients,
    lifecycle: &Lifecycle,
    request_timeout: Duration,
) -> Batcher<i64, Result<i64, ApiError>> {
    let (raft, peers) = (raft.clone(), peers.clone());
    let limits = batching::Limits {
        in_flight: FORWARDS_IN_FLIGHT,
        max_items: MAX_FORWARDED_KEEP_ALIVES,
        max_bytes: usize::MAX,
    };
    Batcher::start(
        lifecycle,
        limits,
        |_| 0,
        move |ids: Vec<i64>| {
            let (raft, peers) = (raft.clone(), peers.clone());
            async move {
                let count = ids.len();
                let deadline = Instant::now() + request_timeout;
                let (leader, addr) = match other_leader(id, &raft, deadline).await {
                    Ok(found) => found,
                    Err(e) => return vec![Err(e); count],
                };
                metrics::counter!(FORWARDED_KEEP_ALIVE_BATCHES.name).increment(1);
                metrics::counter!(FORWARDED_KEEP_ALIVES.name).increment(count as u64);
                let req = Forward::RefreshBatch { ids: ids.clone() };
                match send_to_leader(&raft, &peers, (leader, &addr), &req, deadline).await {
                    Ok(ForwardReply::Refreshed { ttls }) if ttls.len() == count => {
                        ids.into_iter().zip(ttls).map(refreshed).collect()
                    }
                    Ok(other) => vec![Err(unexpected(other)); count],
                    Err(e) => vec![Err(e); count],
                }
            }
        },
    )
}

/// One lease's answer in a refresh batch: its TTL, or -1 when it does not
/// exist.
fn refreshed((id, ttl): (i64, i64)) -> Result<i64, ApiError> {
    if ttl < 0 {
        Err(ApiError::lease_not_found(LeaseId(id)))
    } else {
        Ok(ttl)
    }
}

/// Keep-alives in one forwarded refresh batch at most.
const MAX_FORWARDED_KEEP_ALIVES: usize = 4096;

/// Forwarded groups under way at once from one follower.
const FORWARDS_IN_FLIGHT: usize = 8;

/// Writes in one forwarded group at most.
const MAX_FORWARDED_WRITES: usize = 512;

/// A URL's scheme for a port with or without TLS.
fn scheme(tls: bool) -> &'static str {
    if tls {
        "https"
    } else {
        "http"
    }
}
