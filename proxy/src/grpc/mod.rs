//! The etcd v3 gRPC API on `--grpc-addr`, one file per service. etcdctl and
//! etcd client libraries point at a proxy unchanged.
//!
//! Most calls pass through to the cell as they are ([`forward`]): the
//! proxy picks the member (the leader for writes and linearizable reads,
//! any member for serializable ones) and retries by the error's retry
//! class. What the proxy answers itself: lease keep-alives (from the
//! session table, `lease.rs`), serializable ranges it holds in its read
//! cache (`kv.rs`, through `ops::kv::range`), and watches, coalesced into
//! one upstream watch per distinct watch (`watch.rs`).

pub mod auth;
pub mod client_token;
pub mod cluster;
pub mod kv;
pub mod lease;
pub mod maintenance;
pub mod request_metrics;
pub mod tenants;
pub mod watch;

use crate::ops::locks::UpstreamLocks;
use crate::state::ProxyState;
use crate::upstream::cell_client::HasHeader;
use crate::upstream::{Kind, Route};
use latchkey_shared::client::call::MAX_FORWARDED_BYTES;
use latchkey_shared::etcdpb::{
    PbClusterServer, PbKvServer, PbLeaseServer, PbMaintenanceServer, PbWatchServer,
};
use std::sync::Arc;

/// Forwards one unary call to the cell `cell` (timed and counted by
/// [`request_metrics`], like every unary call).
pub async fn forward<Req, Resp>(
    cell: &crate::upstream::Cell,
    route: Route,
    kind: Kind,
    path: &'static str,
    request: tonic::Request<Req>,
) -> Result<tonic::Response<Resp>, tonic::Status>
where
    Req: prost::Message + Clone + Send + Sync + 'static,
    Resp: prost::Message + Default + Send + Sync + HasHeader + 'static,
{
    // Passed through as the client: the cell checks its token.
    let token = crate::ops::auth::client_token();
    let who = crate::upstream::Who::Client(token.as_deref());
    answer(
        cell.call_as(who, route, kind, path, request.into_inner())
            .await,
    )
}

/// A service impl whose listed methods pass through to the home cell's
/// leader unchanged (through [`forward`]),
/// followed by the methods the proxy serves itself:
///
/// ```ignore
/// service! {
///     impl PbClusterService for ClusterService {
///         pass_through {
///             member_add(PbMemberAddRequest) -> PbMemberAddResponse = Write, MEMBER_ADD;
///         }
///         // other methods, written out
///     }
/// }
/// ```
///
/// The whole impl is generated so that `async_trait` sees the methods the
/// macro writes.
macro_rules! service {
    (impl $service:ident for $for:ident {
        pass_through {
            $( $name:ident($req:ty) -> $resp:ty = $kind:ident, $path:expr; )*
        }
        $($rest:tt)*
    }) => {
        #[tonic::async_trait]
        impl $service for $for {
            $(
                async fn $name(
                    &self,
                    request: tonic::Request<$req>,
                ) -> Result<tonic::Response<$resp>, tonic::Status> {
                    let cell = self.state.upstream.home().clone();
                    $crate::grpc::forward(
                        &cell,
                        $crate::upstream::Route::Leader,
                        $crate::upstream::Kind::$kind,
                        $path,
                        request,
                    )
                    .await
                }
            )*
            $($rest)*
        }
    };
}
pub(crate) use service;

/// An operation's result as the client gets it.
pub fn answer<T>(
    result: Result<T, latchkey_shared::ApiError>,
) -> Result<tonic::Response<T>, tonic::Status> {
    result.map(tonic::Response::new).map_err(Into::into)
}

/// How often an idle client connection is pinged, and how long its answer
/// may take (etcd's server defaults: 2 h and 20 s are for the open
/// internet; a proxy's clients are in the same data centre).
const CLIENT_PING_INTERVAL: std::time::Duration = std::time::Duration::from_secs(30);
const CLIENT_PING_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Streams one client connection may hold open. etcd clients multiplex
/// every watch and lease of a process on a few streams; this bounds what
/// one connection can make the proxy hold.
const MAX_STREAMS_PER_CONNECTION: u32 = 10_000;

/// Serves the etcd API until `shutdown` resolves.
pub async fn serve(
    state: Arc<ProxyState>,
    listener: latchkey_shared::tls::Incoming,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    // A client's request reaches the cell, which judges its size with
    // etcd's errors; the proxy only bounds what it decodes at all.
    let max = MAX_FORWARDED_BYTES;
    let upstream_locks = Arc::new(UpstreamLocks {
        state: state.clone(),
    });
    tonic::transport::Server::builder()
        .layer(request_metrics::RequestMetricsLayer)
        .layer(client_token::ClientTokenLayer)
        // A client that vanished without closing its connection (a
        // crashed host, a partition) is noticed and its streams (and their
        // upstream streams) end, as etcd's server does with its keepalive.
        .http2_keepalive_interval(Some(CLIENT_PING_INTERVAL))
        .http2_keepalive_timeout(Some(CLIENT_PING_TIMEOUT))
        .tcp_keepalive(Some(CLIENT_PING_INTERVAL))
        .max_concurrent_streams(Some(MAX_STREAMS_PER_CONNECTION))
        .add_service(
            PbKvServer::new(kv::KvService {
                state: state.clone(),
            })
            .max_decoding_message_size(max),
        )
        .add_service(
            PbLeaseServer::new(lease::LeaseService {
                state: state.clone(),
            })
            .max_decoding_message_size(max),
        )
        .add_service(
            PbWatchServer::new(watch::WatchService {
                state: state.clone(),
            })
            .max_decoding_message_size(max),
        )
        .add_service(latchkey_shared::v3lockpb::lock_server::LockServer::new(
            latchkey_shared::lock::LockService::new(upstream_locks.clone()),
        ))
        .add_service(
            latchkey_shared::v3electionpb::election_server::ElectionServer::new(
                latchkey_shared::lock::ElectionService::new(upstream_locks),
            ),
        )
        .add_service(PbClusterServer::new(cluster::ClusterService {
            state: state.clone(),
        }))
        .add_service(PbMaintenanceServer::new(maintenance::MaintenanceService {
            state: state.clone(),
        }))
        .add_service(latchkey_shared::auth_pb::auth_server::AuthServer::new(
            auth::AuthService {
                state: state.clone(),
            },
        ))
        .add_service(
            latchkey_shared::tenants_pb::tenants_server::TenantsServer::new(
                tenants::TenantsService { state },
            ),
        )
        .serve_with_incoming_shutdown(listener, shutdown)
        .await?;
    Ok(())
}
