//! The etcd v3 gRPC API on the client address, one file per service.
//!
//! Handlers validate input, hand the request to the [`CellNode`] (which
//! decides where it is served) and fill the response header. Errors become
//! gRPC statuses through the one table in `latchkey_shared::error`.
//! `v3lockpb.Lock` and `v3electionpb.Election` are the shared recipes'
//! services over [`lock::LocalLocks`].

pub mod cluster;
pub mod kv;
pub mod lease;
pub mod lock;
pub mod maintenance;
pub mod sessions;
pub mod watch;

use crate::node::CellNode;
use crate::watch::stream::WatchOptions;
use latchkey_shared::sessions_pb::sessions_server::SessionsServer;

use latchkey_shared::client::refresh_stream::MAX_BATCH as MAX_REFRESH_BATCH;
use latchkey_shared::etcdpb::{
    PbClusterServer, PbKvServer, PbLeaseServer, PbMaintenanceServer, PbResponseHeader,
    PbWatchServer,
};
use latchkey_shared::ApiError;
use std::sync::Arc;

/// Takes the reply out of an applied [`Response`](crate::raft::command::Response),
/// or its error.
macro_rules! expect_reply {
    ($resp:expr, $pat:pat => $val:expr) => {
        match $resp.result {
            Ok($pat) => Ok($val),
            Ok(other) => Err(latchkey_shared::ApiError::internal(format!(
                "unexpected apply result {other:?}"
            ))),
            Err(e) => Err(e),
        }
    };
}
pub(crate) use expect_reply;

/// Rejects a value over the configured limit before it is proposed.
pub fn check_value(node: &CellNode, len: usize) -> Result<(), ApiError> {
    if len > node.limits.max_value_bytes {
        return Err(ApiError::value_too_large(len, node.limits.max_value_bytes));
    }
    Ok(())
}

/// Refuses a request over the size limit before anything else, with
/// etcd's errors: "request is too large" up to the transport's allowance
/// past the limit, grpc-go's "message larger than max" beyond it.
pub fn check_request_size(node: &CellNode, len: usize) -> Result<(), ApiError> {
    let limit = node.limits.max_request_bytes;
    if len > limit + GRPC_OVERHEAD_BYTES {
        return Err(ApiError::message_too_large(
            len,
            limit + GRPC_OVERHEAD_BYTES,
        ));
    }
    if len > limit {
        return Err(ApiError::request_too_large());
    }
    Ok(())
}

/// The answer for an etcd RPC latchkey does not serve yet: gRPC's own
/// "unimplemented", which etcd clients report as such.
pub fn not_built(what: &str) -> tonic::Status {
    ApiError::unimplemented(what).into()
}

pub fn header_into(node: &CellNode, header: &mut Option<PbResponseHeader>, revision: i64) {
    *header = Some(node.header(revision));
}

/// What the transport accepts beyond the request limit (etcd's own
/// allowance for gRPC framing, 512 KiB).
const GRPC_OVERHEAD_BYTES: usize = 512 * 1024;

pub use latchkey_shared::net::nodelay_incoming;

/// Serves the etcd API until `shutdown` resolves.
pub async fn serve(
    node: Arc<CellNode>,
    listener: tokio::net::TcpListener,
    max_request_bytes: usize,
    watch_options: WatchOptions,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    // The transport takes a little more than the request limit, as etcd's
    // does, so that a request just over it reaches the handler and gets
    // etcd's "request is too large" (which clients know) instead of a
    // transport error.
    // Twice that is decoded at all, so that a message a little over the
    // allowance still gets grpc-go's answer from `check_request_size`;
    // beyond it tonic refuses it unread with its own.
    let max_message = (max_request_bytes + GRPC_OVERHEAD_BYTES) * 2;
    let kv = PbKvServer::new(kv::KvService { node: node.clone() })
        .max_decoding_message_size(max_message);
    let lease = PbLeaseServer::new(lease::LeaseService { node: node.clone() })
        .max_decoding_message_size(max_message);
    let maintenance =
        PbMaintenanceServer::new(maintenance::MaintenanceService { node: node.clone() });
    let watch = PbWatchServer::new(watch::WatchService {
        node: node.clone(),
        options: watch_options,
    })
    .max_decoding_message_size(max_message);
    // A batch of 200 000 ids is 1.6 MB: the request limit does not apply.
    let sessions = SessionsServer::new(sessions::SessionsService {
        node: node.clone(),
        max_batch: MAX_REFRESH_BATCH,
    })
    .max_decoding_message_size(MAX_REFRESH_BATCH * 11 + 1024)
    .max_encoding_message_size(MAX_REFRESH_BATCH * 11 + 1024);
    let local_locks = Arc::new(lock::LocalLocks::new(node.clone()));
    let locks = latchkey_shared::v3lockpb::lock_server::LockServer::new(
        latchkey_shared::lock::LockService::new(local_locks.clone()),
    );
    let elections = latchkey_shared::v3electionpb::election_server::ElectionServer::new(
        latchkey_shared::lock::ElectionService::new(local_locks),
    );
    let cluster = PbClusterServer::new(cluster::ClusterService { node });
    tonic::transport::Server::builder()
        .add_service(kv)
        .add_service(lease)
        .add_service(maintenance)
        .add_service(cluster)
        .add_service(watch)
        .add_service(sessions)
        .add_service(locks)
        .add_service(elections)
        .serve_with_incoming_shutdown(nodelay_incoming(listener), shutdown)
        .await?;
    Ok(())
}
