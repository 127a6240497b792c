//! The server side of member-to-member RPCs: hands Raft messages to
//! openraft and forwarded client requests to the [`ForwardHandler`].
//!
//! With the error module, this is the one place that builds gRPC statuses
//! itself: a payload it cannot decode or encode is a fault of the peer
//! protocol, not an API error.

use super::protocol::{Forward, ForwardHandler};
use crate::metrics_catalog::PEER_REQUESTS_REFUSED;
use crate::raft::leader_contact::LeaderContact;
use crate::raft::network::CLUSTER_ID_HEADER;
use crate::raft::snapshot_receipt::SnapshotReceipt;
use crate::raft::{NodeId, Raft, TypeConfig};
use crate::storage::codec::{decode, encode};
use latchkey_shared::peer::peer_server::Peer;
use latchkey_shared::peer::Payload;
use latchkey_shared::tls::RemotePeer;
use latchkey_shared::ApiError;
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, VoteRequest,
};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::sync::Arc;
use tonic::{Request, Response, Status};

/// How long a member that took a snapshot chunk keeps sitting out
/// elections after it: a few heartbeats, for the leader's next chunk or
/// heartbeat to arrive.
pub const AFTER_SNAPSHOT_CHUNK: std::time::Duration = std::time::Duration::from_secs(1);

pub struct PeerService<H> {
    /// The cell this member belongs to; requests for another are refused.
    pub cluster_id: u64,
    pub raft: Raft,
    pub handler: Arc<H>,
    /// Holds this member's elections off while a snapshot arrives.
    pub snapshot_receipt: Arc<SnapshotReceipt>,
    /// Told whenever a leader's AppendEntries or snapshot chunk is taken.
    pub leader_contact: Arc<LeaderContact>,
    /// Peer TLS is on: every connection came with a certificate of the
    /// cell's CA, and each request must also come from a member's
    /// (see [`PeerService::check_member`]).
    pub names_checked: bool,
}

impl<H> PeerService<H> {
    /// The payload of `req` once it is known to come from this cell.
    fn decode_req<T: DeserializeOwned>(&self, req: Request<Payload>) -> Result<T, Status> {
        check_cell(self.cluster_id, &req)?;
        self.check_member(&req)?;
        decode(&req.into_inner().data)
            .map_err(|e| Status::invalid_argument(format!("undecodable peer payload: {e}")))
    }
}

impl<H> PeerService<H> {
    /// With peer TLS, refuses a request whose certificate names no member
    /// of the cell: a member's certificate must name the host of its peer
    /// address in the membership (a DNS name or an IP address among its
    /// subject alternative names). A member that holds no membership yet
    /// (one joining, before its first entries) cannot tell who its members
    /// are, and takes any certificate of the cell's CA.
    fn check_member(&self, req: &Request<Payload>) -> Result<(), Status> {
        if !self.names_checked {
            return Ok(());
        }
        // Every peer request passes here (each AppendEntries): the check
        // reads the membership in place and parses the certificate once;
        // the hosts are collected only for a refusal's message.
        let peer = RemotePeer::of(req);
        let metrics = self.raft.metrics();
        let hosts: Vec<String> = {
            let m = metrics.borrow();
            let mut hosts = m
                .membership_config
                .membership()
                .nodes()
                .map(|(_, member)| host_of(&member.peer_addr))
                .peekable();
            if hosts.peek().is_none()
                || peer.is_some_and(|p| p.certificate_names_any(hosts.by_ref()))
            {
                return Ok(());
            }
            m.membership_config
                .membership()
                .nodes()
                .map(|(_, member)| host_of(&member.peer_addr).to_string())
                .collect()
        };
        metrics::counter!(PEER_REQUESTS_REFUSED.name).increment(1);
        let from = peer.map_or_else(|| "an unknown address".to_string(), |p| p.addr.to_string());
        let message = format!(
            "the certificate of {from} names no member of this cell (members: {}): a member's \
             peer certificate must name the host of its peer address",
            hosts.join(", ")
        );
        tracing::warn!(%message, "peer request refused");
        Err(Status::permission_denied(message))
    }
}

/// The host of a `host:port` address (an IPv6 address without brackets).
fn host_of(addr: &str) -> &str {
    let host = addr.rsplit_once(':').map_or(addr, |(host, _)| host);
    host.trim_start_matches('[').trim_end_matches(']')
}

/// Refuses a request that does not name cell `ours`.
fn check_cell(ours: u64, req: &Request<Payload>) -> Result<(), Status> {
    let theirs = req
        .metadata()
        .get(CLUSTER_ID_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| u64::from_str_radix(v, 16).ok());
    if theirs == Some(ours) {
        return Ok(());
    }
    metrics::counter!(PEER_REQUESTS_REFUSED.name).increment(1);
    let theirs = theirs.map_or_else(|| "no cell".to_string(), |id| format!("cell {id:x}"));
    let message = format!(
        "this member belongs to cell {ours:x} and the request came from {theirs}: members of \
         one cell start with the same --initial-cluster and, when restored, the same --restore \
         file"
    );
    tracing::warn!(%message, "peer request refused");
    Err(Status::failed_precondition(message))
}

fn reply<T: Serialize>(value: &T) -> Result<Response<Payload>, Status> {
    encode(value)
        .map(|data| Response::new(Payload { data }))
        .map_err(|e| Status::internal(e.to_string()))
}

#[tonic::async_trait]
impl<H: ForwardHandler> Peer for PeerService<H> {
    async fn append_entries(&self, req: Request<Payload>) -> Result<Response<Payload>, Status> {
        let rpc: AppendEntriesRequest<TypeConfig> = self.decode_req(req)?;
        let result = self.raft.append_entries(rpc).await;
        // Any answer but "your vote is out of date" took a current
        // leader's message.
        if matches!(&result, Ok(resp) if !matches!(resp, AppendEntriesResponse::HigherVote(_))) {
            self.leader_contact.heard();
        }
        reply(&result)
    }

    async fn vote(&self, req: Request<Payload>) -> Result<Response<Payload>, Status> {
        let rpc: VoteRequest<NodeId> = self.decode_req(req)?;
        reply(&self.raft.vote(rpc).await)
    }

    async fn install_snapshot(&self, req: Request<Payload>) -> Result<Response<Payload>, Status> {
        let rpc: InstallSnapshotRequest<TypeConfig> = self.decode_req(req)?;
        // No election while a chunk is handled (the last installs the whole
        // image before it is answered: over a second for a large snapshot)
        // nor for a moment after one: an election would depose the leader
        // and the transfer would start over under the next one, forever
        // for a snapshot that takes longer than an election timeout.
        let chunk = self.snapshot_receipt.chunk(rpc.vote);
        let sender = rpc.vote;
        let result = self.raft.install_snapshot(rpc).await;
        if matches!(&result, Ok(resp) if resp.vote <= sender) {
            self.leader_contact.heard();
        }
        chunk.answered(result.as_ref().ok().map(|resp| &resp.vote));
        reply(&result)
    }

    async fn forward(&self, req: Request<Payload>) -> Result<Response<Payload>, Status> {
        let forward: Forward = self.decode_req(req)?;
        let result: Result<_, ApiError> = self.handler.serve_forwarded(&forward).await;
        reply(&result)
    }
}
