//! etcd's KV operations on a member: ranges (linearizable unless the
//! client asked for serializable), puts, deletes, txns (one that only
//! reads skips the log) and compaction.

use super::{check_request_size, check_value, expect_reply};
use crate::mvcc::{range, txn};
use crate::node::CellNode;
use crate::raft::command::{Reply, Request};
use latchkey_shared::etcdpb::{
    PbCompactionRequest, PbCompactionResponse, PbDeleteRequest, PbDeleteResponse, PbPutRequest,
    PbPutResponse, PbRangeRequest, PbRangeResponse, PbTxnOpResponse, PbTxnRequest, PbTxnResponse,
};
use latchkey_shared::ApiError;
use prost::Message;
use std::sync::Arc;

/// The KV operations of one member.
#[derive(Clone)]
pub struct Kv {
    node: Arc<CellNode>,
}

impl Kv {
    pub fn new(node: Arc<CellNode>) -> Kv {
        Kv { node }
    }

    /// A range, linearizable unless the client asked for serializable.
    /// A range read. Unless `arriving_ok` (a proxy's), refused if a move
    /// is still bringing keys of the range in, as of the state it is read
    /// at: checked when the request arrived, a member behind could let it
    /// through to a half-made copy.
    pub async fn range(
        &self,
        req: &PbRangeRequest,
        arriving_ok: bool,
    ) -> Result<PbRangeResponse, ApiError> {
        if !req.serializable {
            self.node.linearizable_barrier().await?;
        }
        // An O(1) clone of the persistent keyspace under the lock; the scan
        // runs outside it, so a large range never holds up apply (cell
        // review P1).
        let keys = self.node.state.read(|s| s.keys.clone());
        if !arriving_ok {
            refuse_arriving_in(
                &keys,
                &[latchkey_shared::auth::view::range_of(
                    &req.key,
                    &req.range_end,
                )],
            )?;
        }
        let mut resp = range::range(&keys, req)?;
        resp.header = Some(self.node.header(keys.revision()));
        Ok(resp)
    }

    pub async fn put(&self, req: PbPutRequest) -> Result<PbPutResponse, ApiError> {
        check_request_size(&self.node, req.encoded_len())?;
        check_value(&self.node, req.value.len())?;
        let resp = self.node.write(Request::Put(req)).await?;
        let mut reply = expect_reply!(resp, Reply::Put(r) => r)?;
        reply.header = Some(self.node.header(resp.revision));
        Ok(reply)
    }

    pub async fn delete_range(&self, req: PbDeleteRequest) -> Result<PbDeleteResponse, ApiError> {
        check_request_size(&self.node, req.encoded_len())?;
        let resp = self.node.write(Request::DeleteRange(req)).await?;
        let mut reply = expect_reply!(resp, Reply::DeleteRange(r) => r)?;
        reply.header = Some(self.node.header(resp.revision));
        Ok(reply)
    }

    /// A txn; with `arriving_ok` false (not a proxy's), one answered
    /// without a write is refused, as of the state it is read at, if a move
    /// is still bringing keys of it in (a writing one is refused where it
    /// is applied).
    pub async fn txn(
        &self,
        req: PbTxnRequest,
        arriving_ok: bool,
    ) -> Result<PbTxnResponse, ApiError> {
        check_request_size(&self.node, req.encoded_len())?;
        check_value(&self.node, txn::txn_max_value(&req))?;
        // A txn that cannot write needs no log entry: it is evaluated after
        // the read index, like a linearizable range. Nor does one whose
        // compares send it down branches that only read (a compare-and-swap
        // that lost, answering the current value); it is decided again
        // after the read index, and if a write got in between and it would
        // now write, it goes through the log as any txn.
        if !txn::txn_writes(&req) || !self.takes_writing_path(&req) {
            self.node.linearizable_barrier().await?;
            if let Some(reply) = self.read_only_txn(&req, arriving_ok)? {
                return Ok(reply);
            }
        }
        let resp = self.node.write(Request::Txn(req)).await?;
        let mut reply = expect_reply!(resp, Reply::Txn(r) => r)?;
        fill_txn_headers(&self.node, &mut reply, resp.revision);
        Ok(reply)
    }

    pub async fn compact(
        &self,
        req: PbCompactionRequest,
    ) -> Result<PbCompactionResponse, ApiError> {
        let revision = req.revision;
        let resp = self.node.write(Request::Compact { revision }).await?;
        expect_reply!(resp, Reply::Compacted => ())?;
        Ok(PbCompactionResponse {
            header: Some(self.node.header(resp.revision)),
        })
    }

    /// Refuses a client (not a proxy) any of `ranges` while a move brings
    /// keys of it into this cell.
    pub fn refuse_arriving(&self, ranges: &[latchkey_shared::KeyRange]) -> Result<(), ApiError> {
        self.node
            .state
            .read(|s| refuse_arriving_in(&s.keys, ranges))
    }

    /// Whether `req` would write if applied to this member's state now.
    fn takes_writing_path(&self, req: &PbTxnRequest) -> bool {
        let keys = self.node.state.read(|s| s.keys.clone());
        txn::txn_path_writes(&keys, req)
    }

    /// `req` evaluated on this member's applied state, writing nothing;
    /// `None` if the branches it takes there would write.
    fn read_only_txn(
        &self,
        req: &PbTxnRequest,
        arriving_ok: bool,
    ) -> Result<Option<PbTxnResponse>, ApiError> {
        // O(1) clones (persistent maps) under the lock; evaluated outside
        // it, and the clones are dropped.
        let (mut keys, mut leases) = self.node.state.read(|s| (s.keys.clone(), s.leases.clone()));
        if !arriving_ok {
            refuse_arriving_in(&keys, &latchkey_shared::txn_op::ranges(req))?;
        }
        let revision = keys.revision();
        let mut kv = txn::Kv {
            keys: &mut keys,
            leases: &mut leases,
        };
        let Some(mut reply) = txn::txn_if_read_only(&mut kv, req)? else {
            return Ok(None);
        };
        fill_txn_headers(&self.node, &mut reply, revision);
        Ok(Some(reply))
    }
}

/// `wrong_cell` if a move is still bringing keys of `ranges` into `keys`.
fn refuse_arriving_in(
    keys: &crate::mvcc::keyspace::KeySpace,
    ranges: &[latchkey_shared::KeyRange],
) -> Result<(), ApiError> {
    match keys.ownership() {
        Some(o) if !o.arriving.is_empty() => {
            ranges.iter().try_for_each(|r| o.check_not_arriving(r))
        }
        _ => Ok(()),
    }
}

/// Gives a txn response and every response inside it (nested txns too) the
/// header of the txn's revision, as etcd does: etcd's Go client reads
/// `ResponseRange.Header.Revision` inside a txn (its STM dereferences it).
fn fill_txn_headers(node: &CellNode, reply: &mut PbTxnResponse, revision: i64) {
    reply.header = Some(node.header(revision));
    for op in &mut reply.responses {
        match &mut op.response {
            Some(PbTxnOpResponse::ResponseRange(r)) => r.header = Some(node.header(revision)),
            Some(PbTxnOpResponse::ResponsePut(r)) => r.header = Some(node.header(revision)),
            Some(PbTxnOpResponse::ResponseDeleteRange(r)) => r.header = Some(node.header(revision)),
            Some(PbTxnOpResponse::ResponseTxn(t)) => fill_txn_headers(node, t, revision),
            None => {}
        }
    }
}
