//! A running member of a cell: the Raft handle, the applied state, the
//! lessor, and the rules for where a request is served.
//!
//! Any member accepts any request. Writes, linearizable reads (their read
//! index), keep-alives and time-to-live are served by the leader: a
//! follower forwards them over the peer service. While there is no leader a
//! request waits up to the request timeout, then fails `no_leader`.

use crate::config::Resolved;
use crate::lease::lessor::{Lessor, RefreshError};
use crate::membership::{self, MembershipChange};
use crate::raft::network::{peer_channel, peer_client};
use crate::raft::{codec, NodeId, Raft};
use crate::state_machine::command::{Reply, Request, Response};
use crate::state_machine::store::SharedState;
use crate::watch::hub::WatchHub;
use dashmap::DashMap;
use latchkey_shared::etcdpb::PbResponseHeader;
use latchkey_shared::peer::peer_client::PeerClient;
use latchkey_shared::peer::Payload;
use latchkey_shared::{ApiError, ErrorCode};
use openraft::error::{CheckIsLeaderError, ClientWriteError, RaftError};
use openraft::ServerState;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use tonic::transport::Channel;

/// A request a follower sends to the leader.
#[derive(Debug, Serialize, Deserialize)]
pub enum Forward {
    Write(Request),
    ReadIndex,
    KeepAlive {
        id: i64,
    },
    /// Many leases refreshed at once (the sessions extension).
    RefreshBatch {
        ids: Vec<i64>,
    },
    TimeToLive {
        id: i64,
    },
    Membership(MembershipChange),
    MoveLeader {
        target: NodeId,
    },
    /// Sent to one member (not the leader): start an election now.
    Campaign,
}

#[derive(Debug, Serialize, Deserialize)]
pub enum ForwardReply {
    Written(Response),
    ReadIndex(u64),
    KeepAlive {
        ttl: i64,
    },
    /// Per requested id: its TTL, or -1 if it does not exist.
    Refreshed {
        ttls: Vec<i64>,
    },
    TimeToLive(LeaseTtl),
    Done,
}

/// What TimeToLive reports about a lease.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LeaseTtl {
    pub remaining: i64,
    pub granted: i64,
    pub keys: Vec<Vec<u8>>,
}

/// Limits enforced before a request is proposed.
#[derive(Debug, Clone)]
pub struct Limits {
    pub max_value_bytes: usize,
    pub quota_bytes: u64,
    pub min_ttl: i64,
    pub max_ttl: i64,
}

pub struct CellNode {
    pub id: NodeId,
    pub cluster_id: u64,
    pub name: String,
    pub client_url: String,
    pub raft: Raft,
    pub state: SharedState,
    pub lessor: Arc<Lessor>,
    pub watch_hub: Arc<WatchHub>,
    /// The log store's database, for maintenance.
    pub db: Arc<rocksdb::DB>,
    pub limits: Limits,
    pub request_timeout: Duration,
    pub election_timeout: Duration,
    /// What a new leader gives a lease that its checkpoint says is nearly
    /// or already due (see the lessor).
    pub lease_grace: Duration,
    /// How often the leader checkpoints refreshed leases through Raft.
    pub lease_checkpoint_interval: Duration,
    /// Peer clients by address, made on first use.
    peers: DashMap<String, PeerClient<Channel>>,
}

fn fatal(e: impl std::fmt::Display) -> ApiError {
    ApiError::unavailable(format!("raft stopped: {e}"))
}

impl CellNode {
    pub fn new(
        cfg: &Resolved,
        raft: Raft,
        state: SharedState,
        lessor: Arc<Lessor>,
        watch_hub: Arc<WatchHub>,
        db: Arc<rocksdb::DB>,
    ) -> Self {
        CellNode {
            id: cfg.id,
            cluster_id: cfg.cluster_id,
            name: cfg.name.clone(),
            client_url: format!("http://{}", cfg.cfg.client_addr),
            raft,
            state,
            lessor,
            watch_hub,
            db,
            limits: Limits {
                max_value_bytes: cfg.cfg.max_value_bytes,
                quota_bytes: cfg.cfg.quota_bytes,
                min_ttl: cfg.cfg.min_ttl,
                max_ttl: cfg.cfg.max_ttl,
            },
            request_timeout: Duration::from_millis(cfg.cfg.request_timeout_ms),
            election_timeout: Duration::from_millis(cfg.cfg.election_timeout_ms),
            lease_grace: Duration::from_millis(cfg.cfg.lease_grace_ms),
            lease_checkpoint_interval: Duration::from_millis(
                cfg.cfg.lease_checkpoint_interval_ms.max(50),
            ),
            peers: DashMap::new(),
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

    pub fn is_leader(&self) -> bool {
        let m = self.raft.metrics();
        let m = m.borrow();
        m.state == ServerState::Leader && m.current_leader == Some(self.id)
    }

    /// The current leader and its peer address, waiting for one to be
    /// elected until `deadline`.
    async fn leader(&self, deadline: Instant) -> Result<(NodeId, String), ApiError> {
        let mut rx = self.raft.metrics();
        loop {
            {
                let m = rx.borrow_and_update();
                if let Some(leader) = m.current_leader {
                    if let Some(node) = m.membership_config.membership().get_node(&leader) {
                        return Ok((leader, node.peer_addr.clone()));
                    }
                }
            }
            match tokio::time::timeout_at(deadline, rx.changed()).await {
                Ok(Ok(())) => continue,
                Ok(Err(_)) => return Err(ApiError::unavailable("raft stopped")),
                Err(_) => return Err(ApiError::etcd(ErrorCode::NoLeader)),
            }
        }
    }

    fn peer(&self, addr: &str) -> Result<PeerClient<Channel>, ApiError> {
        if let Some(c) = self.peers.get(addr) {
            return Ok(c.clone());
        }
        let channel = peer_channel(addr)
            .map_err(|e| ApiError::internal(format!("bad peer address {addr}: {e}")))?;
        let client = peer_client(channel);
        self.peers.insert(addr.to_string(), client.clone());
        Ok(client)
    }

    /// Runs `req` on the leader: locally when this member leads, else over
    /// the peer service. Retries through leader changes until the deadline.
    async fn on_leader(&self, req: Forward) -> Result<ForwardReply, ApiError> {
        let deadline = Instant::now() + self.request_timeout;
        let payload = codec::encode(&req).map_err(|e| ApiError::internal(e.to_string()))?;
        loop {
            let (leader, addr) = self.leader(deadline).await?;
            let result = if leader == self.id {
                tokio::time::timeout_at(deadline, self.serve_forwarded(&req))
                    .await
                    .unwrap_or_else(|_| Err(ApiError::etcd(ErrorCode::Timeout)))
            } else {
                // Reads, read indexes and keep-alives are safe to repeat.
                let retry_safe = !matches!(req, Forward::Write(_) | Forward::Membership(_));
                self.send_forward(&addr, payload.clone(), deadline, retry_safe)
                    .await
            };
            match result {
                Err(e) if e.code == ErrorCode::NotLeader && Instant::now() < deadline => {
                    // Leadership moved between our look and the call: wait
                    // for the metrics to settle, then follow the new leader.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
                other => return other,
            }
        }
    }

    async fn send_forward(
        &self,
        addr: &str,
        data: Vec<u8>,
        deadline: Instant,
        retry_safe: bool,
    ) -> Result<ForwardReply, ApiError> {
        let mut client = self.peer(addr)?;
        let mut request = tonic::Request::new(Payload { data });
        request.set_timeout(deadline.saturating_duration_since(Instant::now()));
        match client.forward(request).await {
            Ok(resp) => {
                let reply: Result<ForwardReply, ApiError> = codec::decode(&resp.into_inner().data)
                    .map_err(|e| ApiError::internal(format!("bad forward reply: {e}")))?;
                reply
            }
            Err(status)
                if status.code() == tonic::Code::DeadlineExceeded
                    || status.code() == tonic::Code::Cancelled =>
            {
                Err(ApiError::etcd(ErrorCode::Timeout))
            }
            // The leader we knew is unreachable; it is probably gone, so
            // wait for the election to settle and try whoever leads then.
            // A write may be retried only if it never reached the leader
            // (no connection): one that was sent may have been committed,
            // and applying it twice would break a compare-and-swap.
            Err(status) => {
                let never_sent = status.message().contains("connect error");
                if Instant::now() >= deadline {
                    return Err(ApiError::unavailable(format!(
                        "leader unreachable: {}",
                        status.message()
                    )));
                }
                if !never_sent && !retry_safe {
                    return Err(ApiError::unavailable(format!(
                        "lost the connection to the leader; the write may or may not have been applied: {}",
                        status.message()
                    )));
                }
                Err(ApiError::new(
                    ErrorCode::NotLeader,
                    status.message().to_string(),
                ))
            }
        }
    }

    /// Serves a forwarded request on this member, which must lead.
    pub async fn serve_forwarded(&self, req: &Forward) -> Result<ForwardReply, ApiError> {
        match req {
            Forward::Write(r) => self.propose(r.clone()).await.map(ForwardReply::Written),
            Forward::ReadIndex => self.read_index_here().await.map(ForwardReply::ReadIndex),
            Forward::KeepAlive { id } => self
                .refresh_here(*id)
                .await
                .map(|ttl| ForwardReply::KeepAlive { ttl }),
            Forward::RefreshBatch { ids } => self
                .refresh_batch_here(ids)
                .await
                .map(|ttls| ForwardReply::Refreshed { ttls }),
            Forward::TimeToLive { id } => self.ttl_here(*id).await.map(ForwardReply::TimeToLive),
            Forward::Membership(change) => membership::change_here(self, change)
                .await
                .map(|_| ForwardReply::Done),
            Forward::MoveLeader { target } => membership::move_leader_here(self, *target)
                .await
                .map(|_| ForwardReply::Done),
            Forward::Campaign => {
                self.raft.trigger().elect().await.map_err(fatal)?;
                Ok(ForwardReply::Done)
            }
        }
    }

    /// Checks limits that depend on the current state, then proposes.
    async fn propose(&self, req: Request) -> Result<Response, ApiError> {
        self.check_quota(&req)?;
        let started = std::time::Instant::now();
        let result = self.raft.client_write(req).await;
        metrics::histogram!("latchkey_proposal_commit_seconds")
            .record(started.elapsed().as_secs_f64());
        match result {
            Ok(resp) => Ok(resp.data),
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(_))) => {
                Err(ApiError::etcd(ErrorCode::NotLeader))
            }
            Err(RaftError::APIError(e)) => Err(ApiError::unavailable(e.to_string())),
            Err(RaftError::Fatal(e)) => Err(fatal(e)),
        }
    }

    fn check_quota(&self, req: &Request) -> Result<(), ApiError> {
        let added = match req {
            Request::Put(p) => (p.key.len() + p.value.len()) as u64,
            Request::Txn(t) => crate::mvcc::txn::txn_put_bytes(t),
            Request::LeaseGrant { .. } => 1,
            _ => 0,
        };
        if added == 0 {
            return Ok(());
        }
        let used = self.state.read(|s| s.keys.bytes());
        if used + added > self.limits.quota_bytes {
            return Err(ApiError::new(
                ErrorCode::QuotaExceeded,
                format!(
                    "keyspace holds {used} bytes; quota is {} bytes",
                    self.limits.quota_bytes
                ),
            ));
        }
        Ok(())
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

    /// Asks the member at `addr` to start an election now.
    pub async fn ask_to_campaign(&self, addr: &str, deadline: Instant) -> Result<(), ApiError> {
        let payload =
            codec::encode(&Forward::Campaign).map_err(|e| ApiError::internal(e.to_string()))?;
        self.send_forward(addr, payload, deadline, true)
            .await
            .map(|_| ())
    }

    /// A replicated write, wherever it arrives.
    pub async fn write(&self, req: Request) -> Result<Response, ApiError> {
        match self.on_leader(Forward::Write(req)).await? {
            ForwardReply::Written(resp) => Ok(resp),
            other => Err(ApiError::internal(format!("unexpected reply {other:?}"))),
        }
    }

    /// The leader's read index: leadership confirmed by a quorum.
    async fn read_index_here(&self) -> Result<u64, ApiError> {
        match self.raft.get_read_log_id().await {
            Ok((read_log_id, _applied)) => Ok(read_log_id.map_or(0, |l| l.index)),
            Err(RaftError::APIError(CheckIsLeaderError::ForwardToLeader(_))) => {
                Err(ApiError::etcd(ErrorCode::NotLeader))
            }
            Err(RaftError::APIError(e)) => Err(ApiError::unavailable(e.to_string())),
            Err(RaftError::Fatal(e)) => Err(fatal(e)),
        }
    }

    /// Waits until this member's state reflects every write acknowledged
    /// before the call: the read index, with no log write.
    pub async fn linearizable_barrier(&self) -> Result<(), ApiError> {
        let index = match self.on_leader(Forward::ReadIndex).await? {
            ForwardReply::ReadIndex(i) => i,
            other => return Err(ApiError::internal(format!("unexpected reply {other:?}"))),
        };
        match tokio::time::timeout(self.request_timeout, self.state.wait_applied(index)).await {
            Ok(true) => Ok(()),
            Ok(false) => Err(ApiError::unavailable("state machine stopped")),
            Err(_) => Err(ApiError::etcd(ErrorCode::Timeout)),
        }
    }

    async fn refresh_here(&self, id: i64) -> Result<i64, ApiError> {
        let deadline = Instant::now() + self.request_timeout;
        loop {
            match self.lessor.refresh(id, Instant::now()) {
                Ok(ttl) => return Ok(ttl),
                Err(RefreshError::NotFound) => {
                    return Err(ApiError::new(
                        ErrorCode::LeaseNotFound,
                        format!("lease {id:x} not found"),
                    ))
                }
                // A new leader promotes its lessor once it has applied an
                // entry of its own term; that takes one commit round.
                Err(RefreshError::NotPrimary) if self.is_leader() && Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(20)).await
                }
                Err(RefreshError::NotPrimary) => return Err(ApiError::etcd(ErrorCode::NotLeader)),
            }
        }
    }

    async fn refresh_batch_here(&self, ids: &[i64]) -> Result<Vec<i64>, ApiError> {
        let deadline = Instant::now() + self.request_timeout;
        loop {
            // 100 000 refreshes take a while: off the async workers (which
            // also run Raft's heartbeats), a bounded chunk per lock so apply
            // never waits long for the lessor.
            let lessor = self.lessor.clone();
            let batch = ids.to_vec();
            let refreshed: Result<Vec<i64>, RefreshError> =
                tokio::task::spawn_blocking(move || {
                    let mut ttls = Vec::with_capacity(batch.len());
                    for chunk in batch.chunks(4096) {
                        ttls.extend(lessor.refresh_many(chunk, Instant::now())?);
                    }
                    Ok(ttls)
                })
                .await
                .map_err(|e| ApiError::internal(e.to_string()))?;
            match refreshed {
                Ok(ttls) => return Ok(ttls),
                // Promotion follows the first commit of the new term.
                Err(_) if self.is_leader() && Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(20)).await
                }
                Err(_) => return Err(ApiError::etcd(ErrorCode::NotLeader)),
            }
        }
    }

    /// Refreshes many leases in one round trip to the leader, wherever it
    /// arrives: per id its TTL, or -1 if the lease does not exist.
    pub async fn refresh_batch(&self, ids: Vec<i64>) -> Result<Vec<i64>, ApiError> {
        let count = ids.len() as u64;
        match self.on_leader(Forward::RefreshBatch { ids }).await? {
            ForwardReply::Refreshed { ttls } => {
                metrics::counter!("latchkey_refresh_batches_total").increment(1);
                metrics::counter!("latchkey_leases_refreshed_total").increment(count);
                Ok(ttls)
            }
            other => Err(ApiError::internal(format!("unexpected reply {other:?}"))),
        }
    }

    /// The primary lessor's checkpoint loop: every interval, the leases
    /// refreshed since their last checkpoint go through Raft, many per entry.
    pub async fn run_lease_checkpoints(self: Arc<Self>) {
        // Bounded entries: 10 000 leases are ~160 KB.
        const BATCH: usize = 10_000;
        let mut tick = tokio::time::interval(self.lease_checkpoint_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            loop {
                let entries = self.lessor.take_checkpoints(Instant::now(), BATCH);
                if entries.is_empty() {
                    break;
                }
                let count = entries.len() as u64;
                match self
                    .raft
                    .client_write(Request::LeaseCheckpoint { entries })
                    .await
                {
                    Ok(_) => metrics::counter!("latchkey_lease_checkpoints_total").increment(count),
                    Err(e) => {
                        tracing::debug!(error = %e, "lease checkpoint not committed");
                        break;
                    }
                }
            }
        }
    }

    /// A keep-alive, wherever it arrives: returns the lease's TTL.
    pub async fn keep_alive(&self, id: i64) -> Result<i64, ApiError> {
        metrics::counter!("latchkey_lease_refreshes_total").increment(1);
        match self.on_leader(Forward::KeepAlive { id }).await? {
            ForwardReply::KeepAlive { ttl } => Ok(ttl),
            other => Err(ApiError::internal(format!("unexpected reply {other:?}"))),
        }
    }

    async fn ttl_here(&self, id: i64) -> Result<LeaseTtl, ApiError> {
        self.read_index_here().await?;
        let remaining = loop {
            match self.lessor.remaining(id, Instant::now()) {
                Ok(r) => break r,
                Err(RefreshError::NotFound) => {
                    return Err(ApiError::new(
                        ErrorCode::LeaseNotFound,
                        format!("lease {id:x} not found"),
                    ))
                }
                Err(RefreshError::NotPrimary) if self.is_leader() => {
                    tokio::time::sleep(Duration::from_millis(20)).await
                }
                Err(RefreshError::NotPrimary) => return Err(ApiError::etcd(ErrorCode::NotLeader)),
            }
        };
        self.state.read(|s| match s.leases.get(id) {
            Some(l) => Ok(LeaseTtl {
                remaining,
                granted: l.ttl,
                keys: l.keys.iter().cloned().collect(),
            }),
            None => Err(ApiError::new(
                ErrorCode::LeaseNotFound,
                format!("lease {id:x} not found"),
            )),
        })
    }

    pub async fn time_to_live(&self, id: i64) -> Result<LeaseTtl, ApiError> {
        match self.on_leader(Forward::TimeToLive { id }).await? {
            ForwardReply::TimeToLive(t) => Ok(t),
            other => Err(ApiError::internal(format!("unexpected reply {other:?}"))),
        }
    }

    /// Makes the lessor primary when this member leads and has applied an
    /// entry of its own term; demotes it otherwise. Runs for the node's life.
    pub async fn run_lessor_promotion(self: Arc<Self>) {
        let mut rx = self.raft.metrics();
        let mut last_leader = None;
        loop {
            let leading = {
                let m = rx.borrow_and_update();
                if m.current_leader != last_leader {
                    // Every change this member observes, including losing
                    // sight of a leader.
                    last_leader = m.current_leader;
                    metrics::counter!("latchkey_leader_changes_total").increment(1);
                    metrics::gauge!("latchkey_raft_term").set(m.current_term as f64);
                }
                m.state == ServerState::Leader && m.current_leader == Some(self.id)
            };
            if leading && !self.lessor.is_primary() {
                // ensure_linearizable waits until the blank entry of this
                // term is applied: then the lease table is complete.
                match tokio::time::timeout(self.request_timeout, self.raft.ensure_linearizable())
                    .await
                {
                    Ok(Ok(_)) if self.is_leader() => {
                        let term = self.raft.metrics().borrow().current_term;
                        self.state.read(|s| {
                            self.lessor
                                .promote(&s.leases.seeds(), Instant::now(), self.lease_grace)
                        });
                        tracing::info!(
                            term,
                            leases = self.lessor.len(),
                            "became leader; lessor promoted"
                        );
                        continue;
                    }
                    _ => {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                }
            } else if !leading && self.lessor.is_primary() {
                self.lessor.demote();
                tracing::info!("lost leadership; lessor demoted");
            }
            if rx.changed().await.is_err() {
                return;
            }
        }
    }

    /// The primary lessor's expiry loop: proposes a `LeaseExpire` for every
    /// batch of leases past their deadline.
    pub async fn run_lease_expiry(self: Arc<Self>) {
        // Expiry is checked at least this often, and right at the earliest
        // deadline otherwise, so a lease expires within ~100 ms of it.
        const MAX_SLEEP: Duration = Duration::from_millis(100);
        // Many expiries in one entry; bounded so one entry stays small.
        const BATCH: usize = 1_000;
        loop {
            let now = Instant::now();
            let wake = self
                .lessor
                .next_deadline()
                .map_or(now + MAX_SLEEP, |d| d.min(now + MAX_SLEEP));
            tokio::time::sleep_until(wake.max(now + Duration::from_millis(5))).await;
            loop {
                let ids = self.lessor.take_expired(Instant::now(), BATCH);
                if ids.is_empty() {
                    break;
                }
                tracing::info!(count = ids.len(), first = ids[0], "expiring leases");
                metrics::counter!("latchkey_leases_expired_total").increment(ids.len() as u64);
                let node = self.clone();
                tokio::spawn(async move {
                    if let Err(e) = node.raft.client_write(Request::LeaseExpire { ids }).await {
                        tracing::warn!(error = %e, "proposing lease expiry failed; will retry");
                    }
                });
            }
        }
    }

    /// Publishes this member's client URL through Raft until it is applied.
    pub async fn run_publish_member(self: Arc<Self>) {
        loop {
            let published = self.state.read(|s| {
                s.members.get(&self.id).is_some_and(|m| {
                    m.client_urls == [self.client_url.clone()] && m.name == self.name
                })
            });
            if published {
                return;
            }
            let req = Request::PublishMember {
                id: self.id,
                name: self.name.clone(),
                client_urls: vec![self.client_url.clone()],
            };
            match self.write(req).await {
                Ok(Response {
                    result: Ok(Reply::Published),
                    ..
                }) => return,
                Ok(other) => tracing::warn!(?other, "publishing member attributes failed"),
                Err(e) => tracing::debug!(error = %e, "publishing member attributes; will retry"),
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}
