//! etcd's lease operations on a member: grant (within the cell's TTL
//! bounds), revoke, one keep-alive, time-to-live and the list of leases.

use super::expect_reply;
use crate::node::CellNode;
use crate::raft::command::{Reply, Request};
use latchkey_shared::etcdpb::{
    PbLeaseGrantRequest, PbLeaseGrantResponse, PbLeaseKeepAliveResponse, PbLeaseLeasesResponse,
    PbLeaseRevokeResponse, PbLeaseStatus, PbLeaseTimeToLiveRequest, PbLeaseTimeToLiveResponse,
};
use latchkey_shared::{ApiError, ErrorCode};
use std::sync::Arc;

/// The lease operations of one member.
#[derive(Clone)]
pub struct Leases {
    node: Arc<CellNode>,
}

impl Leases {
    pub fn new(node: Arc<CellNode>) -> Leases {
        Leases { node }
    }

    pub async fn grant(
        &self,
        mut req: PbLeaseGrantRequest,
    ) -> Result<PbLeaseGrantResponse, ApiError> {
        // A TTL below the minimum is raised to it, as etcd does (review M4):
        // clients that grant 1 s leases work unchanged.
        req.ttl = req.ttl.max(self.node.limits.min_ttl);
        if req.ttl > self.node.limits.max_ttl {
            // etcd's exact text: clients recognise the error by it.
            return Err(ApiError::lease_ttl_too_large());
        }
        if req.id < 0 {
            return Err(ApiError::invalid(
                "lease id must be positive (0 lets the cell choose)",
            ));
        }
        let resp = self
            .node
            .write(Request::LeaseGrant {
                id: req.id,
                ttl: req.ttl,
            })
            .await?;
        let (id, ttl) = expect_reply!(resp, Reply::LeaseGranted { id, ttl } => (id, ttl))?;
        Ok(PbLeaseGrantResponse {
            header: Some(self.node.header(resp.revision)),
            id,
            ttl,
            error: String::new(),
        })
    }

    pub async fn revoke(&self, id: i64) -> Result<PbLeaseRevokeResponse, ApiError> {
        let resp = self.node.write(Request::LeaseRevoke { id }).await?;
        expect_reply!(resp, Reply::LeaseRevoked => ())?;
        Ok(PbLeaseRevokeResponse {
            header: Some(self.node.header(resp.revision)),
        })
    }

    /// One keep-alive. etcd answers a keep-alive for an unknown lease with
    /// TTL 0 rather than an error (on its stream, which stays open).
    pub async fn keep_alive(&self, id: i64) -> Result<PbLeaseKeepAliveResponse, ApiError> {
        let ttl = match self.node.keep_alive(id).await {
            Ok(ttl) => ttl,
            Err(e) if e.code == ErrorCode::LeaseNotFound => 0,
            Err(e) => return Err(e),
        };
        Ok(PbLeaseKeepAliveResponse {
            header: Some(self.node.header_now()),
            id,
            ttl,
        })
    }

    pub async fn time_to_live(
        &self,
        req: PbLeaseTimeToLiveRequest,
    ) -> Result<PbLeaseTimeToLiveResponse, ApiError> {
        match self.node.time_to_live(req.id).await {
            Ok(t) => Ok(PbLeaseTimeToLiveResponse {
                header: Some(self.node.header_now()),
                id: req.id,
                ttl: t.remaining,
                granted_ttl: t.granted,
                keys: if req.keys { t.keys } else { Vec::new() },
            }),
            // etcd reports a missing lease as TTL -1 rather than an error.
            Err(e) if e.code == ErrorCode::LeaseNotFound => Ok(PbLeaseTimeToLiveResponse {
                header: Some(self.node.header_now()),
                id: req.id,
                ttl: -1,
                granted_ttl: 0,
                keys: Vec::new(),
            }),
            Err(e) => Err(e),
        }
    }

    /// Every lease, after the read index (linearizable).
    pub async fn leases(&self) -> Result<PbLeaseLeasesResponse, ApiError> {
        self.node.linearizable_barrier().await?;
        let (leases, revision) = self.node.state.read(|s| {
            let leases = s
                .leases
                .seeds()
                .into_iter()
                .map(|(id, _, _)| PbLeaseStatus { id })
                .collect();
            (leases, s.keys.revision())
        });
        Ok(PbLeaseLeasesResponse {
            header: Some(self.node.header(revision)),
            leases,
        })
    }
}
