//! Both directions of the status map, in memory and over a real gRPC
//! connection on 127.0.0.1, bounded by [`BOUND`].

use super::*;
use crate::error::tests::one_of_each;
use crate::error::Retry;
use crate::peer::peer_client::PeerClient;
use crate::peer::peer_server::{Peer, PeerServer};
use crate::peer::Payload;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tonic::transport::{Channel, Endpoint};

/// The longest any socket test may take.
const BOUND: Duration = Duration::from_secs(10);
/// Short, so a refused or hanging connect fails fast on loopback.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);
/// The per-call deadline, longer than anything the fakes do on loopback.
const CALL_TIMEOUT: Duration = Duration::from_secs(3);

// ---------- status map ----------

#[test]
fn every_code_survives_status_and_back() {
    let mut errors = one_of_each();
    errors.push(ApiError::not_leader(None));
    for e in errors {
        let status: Status = e.clone().into();
        assert_eq!(status.code(), e.code.grpc_code(), "{}", e.code);
        assert_eq!(status.message(), e.grpc_message());
        let back = ApiError::from_status(&status);
        assert_eq!(back, e, "{}", e.code);
    }
}

#[test]
fn metadata_names_code_and_detail() {
    let status = ApiError::not_leader(Some(3)).to_status();
    let md = status.metadata();
    assert_eq!(
        md.get(keys::ERROR).map(|v| v.to_str().ok()),
        Some(Some("not_leader"))
    );
    assert_eq!(
        md.get(keys::LEADER).map(|v| v.to_str().ok()),
        Some(Some("3"))
    );
    assert_eq!(status.message(), "etcdserver: not leader");
    let status = ApiError::compacted(7).to_status();
    assert_eq!(
        status
            .metadata()
            .get(keys::COMPACT_REVISION)
            .map(|v| v.to_str().ok()),
        Some(Some("7"))
    );
}

#[test]
fn a_plain_etcd_status_maps_by_its_text() {
    // What a real etcd server sends: no latchkey metadata.
    for &code in ErrorCode::ALL {
        if let Some(text) = code.etcd_text() {
            let e = ApiError::from_status(&Status::new(code.grpc_code(), text));
            assert_eq!(e.code, code);
            assert_eq!(e.message, text);
            assert_eq!(e.detail, None);
        }
    }
}

#[test]
fn a_foreign_status_maps_by_its_code_alone() {
    let cases = [
        (Code::InvalidArgument, ErrorCode::InvalidArgument),
        (Code::NotFound, ErrorCode::InvalidArgument),
        (Code::FailedPrecondition, ErrorCode::PreconditionFailed),
        (Code::ResourceExhausted, ErrorCode::QuotaExceeded),
        (Code::DeadlineExceeded, ErrorCode::Timeout),
        (Code::Cancelled, ErrorCode::Timeout),
        (Code::Unimplemented, ErrorCode::Unimplemented),
        (Code::Unknown, ErrorCode::Internal),
        (Code::Internal, ErrorCode::Internal),
        // Not Safe: without latchkey's word, an Unavailable may be a
        // connection that broke after the request went out.
        (Code::Unavailable, ErrorCode::WriteOutcomeUnknown),
    ];
    for (grpc, expected) in cases {
        let e = ApiError::from_status(&Status::new(grpc, "from elsewhere"));
        assert_eq!(e.code, expected, "{grpc:?}");
        assert_eq!(e.message, "from elsewhere");
    }
    let e = ApiError::from_status(&Status::unavailable("upstream connect error"));
    assert_eq!(e.retry(), Retry::OutcomeUnknown);
}

#[test]
fn an_unknown_code_name_falls_back_to_the_etcd_text() {
    // A newer member may send a code this one does not know.
    let mut md = MetadataMap::new();
    md.insert(
        keys::ERROR,
        AsciiMetadataValue::from_static("from_the_future"),
    );
    let status = Status::with_metadata(Code::Unavailable, "etcdserver: no leader", md);
    assert_eq!(ApiError::from_status(&status).code, ErrorCode::NoLeader);
}

// ---------- over the wire ----------

/// A peer server whose Forward answers with error number `data[0]` of
/// [`one_of_each`].
struct Failing(Vec<ApiError>);

#[tonic::async_trait]
impl Peer for Failing {
    async fn append_entries(
        &self,
        _: tonic::Request<Payload>,
    ) -> Result<tonic::Response<Payload>, Status> {
        Err(ApiError::unimplemented("AppendEntries").into())
    }

    async fn vote(&self, _: tonic::Request<Payload>) -> Result<tonic::Response<Payload>, Status> {
        Err(ApiError::unimplemented("Vote").into())
    }

    async fn install_snapshot(
        &self,
        _: tonic::Request<Payload>,
    ) -> Result<tonic::Response<Payload>, Status> {
        Err(ApiError::unimplemented("InstallSnapshot").into())
    }

    async fn full_snapshot(
        &self,
        _: tonic::Request<Payload>,
    ) -> Result<tonic::Response<Payload>, Status> {
        Err(ApiError::unimplemented("FullSnapshot").into())
    }

    async fn forward(
        &self,
        request: tonic::Request<Payload>,
    ) -> Result<tonic::Response<Payload>, Status> {
        let i = request.into_inner().data.first().copied().unwrap_or(0) as usize;
        Err(self.0[i].clone().into())
    }
}

#[tokio::test]
async fn errors_cross_a_real_grpc_connection_intact() {
    let errors = one_of_each();
    let (listener, addr) = listen().await;
    let server = Task(tokio::spawn({
        let svc = PeerServer::new(Failing(errors.clone()));
        async move {
            let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
            let _ = tonic::transport::Server::builder()
                .add_service(svc)
                .serve_with_incoming(incoming)
                .await;
        }
    }));
    let mut client = PeerClient::new(channel(&addr));
    for (i, e) in errors.iter().enumerate() {
        let request = Payload {
            data: vec![i as u8],
        };
        let status = tokio::time::timeout(BOUND, client.forward(request))
            .await
            .expect("bounded")
            .expect_err("the server answers with an error");
        assert_eq!(&ApiError::from_status(&status), e, "{}", e.code);
    }
    drop(server);
}

// ---------- helpers ----------

/// Aborts the spawned fake server when the test ends, pass or fail.
struct Task(JoinHandle<()>);

impl Drop for Task {
    fn drop(&mut self) {
        self.0.abort();
    }
}

async fn listen() -> (TcpListener, String) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = format!("http://{}", listener.local_addr().expect("addr"));
    (listener, addr)
}

fn channel(addr: &str) -> Channel {
    Endpoint::from_shared(addr.to_string())
        .expect("uri")
        .connect_timeout(CONNECT_TIMEOUT)
        .timeout(CALL_TIMEOUT)
        .connect_lazy()
}
