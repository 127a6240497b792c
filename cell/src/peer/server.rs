//! The server side of member-to-member RPCs: hands Raft messages to
//! openraft and forwarded client requests to the [`ForwardHandler`].
//!
//! With the error module, this is the one place that builds gRPC statuses
//! itself: a payload it cannot decode or encode is a fault of the peer
//! protocol, not an API error.

use super::protocol::{Forward, ForwardHandler};
use crate::raft::{NodeId, Raft, Snapshot, SnapshotMeta, TypeConfig, Vote};
use crate::storage::codec::{decode, encode};
use latchkey_shared::peer::peer_server::Peer;
use latchkey_shared::peer::Payload;
use latchkey_shared::ApiError;
use openraft::raft::{AppendEntriesRequest, InstallSnapshotRequest, VoteRequest};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::io::Cursor;
use std::sync::Arc;
use tonic::{Request, Response, Status};

pub struct PeerService<H> {
    pub raft: Raft,
    pub handler: Arc<H>,
}

fn decode_req<T: DeserializeOwned>(req: Request<Payload>) -> Result<T, Status> {
    decode(&req.into_inner().data)
        .map_err(|e| Status::invalid_argument(format!("undecodable peer payload: {e}")))
}

fn reply<T: Serialize>(value: &T) -> Result<Response<Payload>, Status> {
    encode(value)
        .map(|data| Response::new(Payload { data }))
        .map_err(|e| Status::internal(e.to_string()))
}

#[tonic::async_trait]
impl<H: ForwardHandler> Peer for PeerService<H> {
    async fn append_entries(&self, req: Request<Payload>) -> Result<Response<Payload>, Status> {
        let rpc: AppendEntriesRequest<TypeConfig> = decode_req(req)?;
        reply(&self.raft.append_entries(rpc).await)
    }

    async fn vote(&self, req: Request<Payload>) -> Result<Response<Payload>, Status> {
        let rpc: VoteRequest<NodeId> = decode_req(req)?;
        reply(&self.raft.vote(rpc).await)
    }

    async fn install_snapshot(&self, req: Request<Payload>) -> Result<Response<Payload>, Status> {
        let rpc: InstallSnapshotRequest<TypeConfig> = decode_req(req)?;
        reply(&self.raft.install_snapshot(rpc).await)
    }

    async fn full_snapshot(&self, req: Request<Payload>) -> Result<Response<Payload>, Status> {
        let (vote, meta, data): (Vote, SnapshotMeta, Vec<u8>) = decode_req(req)?;
        let snapshot = Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        };
        reply(&self.raft.install_full_snapshot(vote, snapshot).await)
    }

    async fn forward(&self, req: Request<Payload>) -> Result<Response<Payload>, Status> {
        let forward: Forward = decode_req(req)?;
        let result: Result<_, ApiError> = self.handler.serve_forwarded(&forward).await;
        reply(&result)
    }
}
