//! The etcd v3 gRPC API on the client address, one file per service.
//!
//! A face: the KV and Lease handlers translate to and from the operations
//! in [`ops`](crate::ops); the others hand the request to the [`CellNode`].
//! Errors become gRPC statuses through the one table in
//! `latchkey_shared::error`. `v3lockpb.Lock` and `v3electionpb.Election`
//! are the shared recipes' services over [`LocalLocks`].

pub mod auth;
pub mod cluster;
pub mod kv;
pub mod lease;
pub mod maintenance;
pub mod moves;
pub mod proxy_auth;
pub mod sessions;
pub mod tenants;
pub mod watch;

use crate::node::CellNode;
use crate::ops::auth::AuthOps;
use crate::ops::auth_gate::AuthGate;
use crate::ops::kv::Kv;
use crate::ops::lease::Leases;
use crate::ops::locks::LocalLocks;
use crate::ops::tenants::TenantOps;
use crate::ops::GRPC_OVERHEAD_BYTES;
use crate::watch::stream::WatchOptions;
use latchkey_shared::sessions_pb::sessions_server::SessionsServer;

use latchkey_shared::auth::proxy_key::ProxyKeys;
use latchkey_shared::etcdpb::{
    PbClusterServer, PbKvServer, PbLeaseServer, PbMaintenanceServer, PbWatchServer,
};
use latchkey_shared::limits::{MAX_REFRESH_BATCH, MAX_REFRESH_MESSAGE_BYTES};
use latchkey_shared::ApiError;
use std::sync::Arc;

/// The answer for an etcd RPC latchkey does not serve yet: gRPC's own
/// "unimplemented", which etcd clients report as such.
pub fn not_built(what: &str) -> tonic::Status {
    ApiError::unimplemented(what).into()
}

/// Serves the etcd API until `shutdown` resolves.
pub async fn serve(
    node: Arc<CellNode>,
    listener: latchkey_shared::tls::Incoming,
    proxy_keys: ProxyKeys,
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
    let gate = Arc::new(AuthGate::new(node.state.clone(), proxy_keys));
    let kv = PbKvServer::new(kv::KvService {
        kv: Kv::new(node.clone()),
        gate: gate.clone(),
    })
    .max_decoding_message_size(max_message);
    let lease = PbLeaseServer::new(lease::LeaseService {
        leases: Leases::new(node.clone()),
        node: node.clone(),
        gate: gate.clone(),
    })
    .max_decoding_message_size(max_message);
    let maintenance = PbMaintenanceServer::new(maintenance::MaintenanceService {
        node: node.clone(),
        gate: gate.clone(),
    });
    let watch = PbWatchServer::new(watch::WatchService {
        node: node.clone(),
        options: watch_options,
        gate: gate.clone(),
    })
    .max_decoding_message_size(max_message);
    // A full refresh batch is larger than the request limit, which does not
    // apply to it: its own bound does.
    let sessions = SessionsServer::new(sessions::SessionsService {
        node: node.clone(),
        max_batch: MAX_REFRESH_BATCH,
        gate: gate.clone(),
    })
    .max_decoding_message_size(MAX_REFRESH_MESSAGE_BYTES)
    .max_encoding_message_size(MAX_REFRESH_MESSAGE_BYTES);
    let local_locks = Arc::new(LocalLocks::new(node.clone()).guarded_by(gate.clone()));
    let locks = latchkey_shared::v3lockpb::lock_server::LockServer::new(
        latchkey_shared::lock::LockService::new(local_locks.clone()),
    );
    let elections = latchkey_shared::v3electionpb::election_server::ElectionServer::new(
        latchkey_shared::lock::ElectionService::new(local_locks),
    );
    let auth = latchkey_shared::auth_pb::auth_server::AuthServer::new(auth::AuthService {
        ops: Arc::new(AuthOps::new(node.clone(), gate.clone())),
    });
    let tenants =
        latchkey_shared::tenants_pb::tenants_server::TenantsServer::new(tenants::TenantsService {
            ops: TenantOps::new(node.clone()),
            gate: gate.clone(),
        });
    let proxy_auth = latchkey_shared::proxy_auth_pb::proxy_auth_server::ProxyAuthServer::new(
        proxy_auth::ProxyAuthService {
            node: node.clone(),
            gate: gate.clone(),
        },
    )
    .max_decoding_message_size(max_message);
    let moves = latchkey_shared::moves_pb::moves_server::MovesServer::new(moves::MovesService {
        node: node.clone(),
        gate: gate.clone(),
    })
    .max_decoding_message_size(max_message);
    let cluster = PbClusterServer::new(cluster::ClusterService { node, gate });
    tonic::transport::Server::builder()
        .add_service(kv)
        .add_service(lease)
        .add_service(maintenance)
        .add_service(cluster)
        .add_service(watch)
        .add_service(sessions)
        .add_service(locks)
        .add_service(elections)
        .add_service(auth)
        .add_service(tenants)
        .add_service(proxy_auth)
        .add_service(moves)
        .serve_with_incoming_shutdown(listener, shutdown)
        .await?;
    Ok(())
}
