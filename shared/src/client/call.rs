//! One gRPC call to a member, named by its method path, for callers that
//! pass etcd's messages through as they are (the proxy). The `etcd-client`
//! crate exposes etcd's messages and server traits but no raw clients, so
//! these build the call from tonic's generic client and prost's codec.
//!
//! Every failure comes back as an [`ApiError`] classified by
//! [`classify_call_failure`]: a call whose connection could not be made is
//! `unavailable` (retry anywhere), a member's own answer keeps its code,
//! and a connection that broke after the request may have been sent is
//! `write_outcome_unknown`.

use crate::{classify_call_failure, ApiError};
use tonic::client::Grpc;
use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::Channel;
use tonic::Streaming;
use tonic_prost::ProstCodec;

/// Largest message decoded from a member. A member's answers are bounded
/// by its own limits (a range is bounded by the keyspace quota); this only
/// keeps a broken peer from making the caller allocate without end.
pub const MAX_ANSWER_BYTES: usize = 256 * 1024 * 1024;

/// Largest message sent to a member: what a client may send the caller
/// (the cell's request limit with gRPC's allowance, twice over), so that
/// the member, not the transport, judges a request that is too large.
pub const MAX_FORWARDED_BYTES: usize = 8 * 1024 * 1024;

fn grpc(channel: Channel) -> Grpc<Channel> {
    Grpc::new(channel)
        .max_decoding_message_size(MAX_ANSWER_BYTES)
        .max_encoding_message_size(MAX_FORWARDED_BYTES)
}

async fn ready(grpc: &mut Grpc<Channel>, path: &str) -> Result<(), ApiError> {
    grpc.ready()
        .await
        .map_err(|e| ApiError::unavailable(format!("{path}: no connection: {e}")))
}

/// A unary call of `path` (`/etcdserverpb.KV/Range`).
pub async fn unary<Req, Resp>(
    channel: Channel,
    path: &'static str,
    request: tonic::Request<Req>,
) -> Result<Resp, ApiError>
where
    Req: prost::Message + Send + Sync + 'static,
    Resp: prost::Message + Default + Send + Sync + 'static,
{
    let mut grpc = grpc(channel);
    ready(&mut grpc, path).await?;
    grpc.unary(
        request,
        PathAndQuery::from_static(path),
        ProstCodec::<Req, Resp>::default(),
    )
    .await
    .map(tonic::Response::into_inner)
    .map_err(|status| classify_call_failure(&status))
}

/// A server-streaming call of `path` (Maintenance/Snapshot).
pub async fn server_streaming<Req, Resp>(
    channel: Channel,
    path: &'static str,
    request: tonic::Request<Req>,
) -> Result<Streaming<Resp>, ApiError>
where
    Req: prost::Message + Send + Sync + 'static,
    Resp: prost::Message + Default + Send + Sync + 'static,
{
    let mut grpc = grpc(channel);
    ready(&mut grpc, path).await?;
    grpc.server_streaming(
        request,
        PathAndQuery::from_static(path),
        ProstCodec::<Req, Resp>::default(),
    )
    .await
    .map(tonic::Response::into_inner)
    .map_err(|status| classify_call_failure(&status))
}

/// A bidirectional call of `path` (Watch/Watch) fed by `requests` (whose
/// metadata goes with the call).
pub async fn streaming<Req, Resp, S>(
    channel: Channel,
    path: &'static str,
    requests: tonic::Request<S>,
) -> Result<Streaming<Resp>, ApiError>
where
    Req: prost::Message + Send + Sync + 'static,
    Resp: prost::Message + Default + Send + Sync + 'static,
    S: futures::Stream<Item = Req> + Send + 'static,
{
    let mut grpc = grpc(channel);
    ready(&mut grpc, path).await?;
    grpc.streaming(
        requests,
        PathAndQuery::from_static(path),
        ProstCodec::<Req, Resp>::default(),
    )
    .await
    .map(tonic::Response::into_inner)
    .map_err(|status| classify_call_failure(&status))
}
