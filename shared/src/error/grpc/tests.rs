//! Both directions of the status map, and transport failures driven over
//! real sockets on 127.0.0.1. Every socket test is bounded by
//! [`BOUND`], so a regression fails instead of hanging.

use super::*;
use crate::error::tests::one_of_each;
use crate::error::Retry;
use crate::peer::peer_client::PeerClient;
use crate::peer::peer_server::{Peer, PeerServer};
use crate::peer::Payload;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
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

#[test]
fn a_server_status_without_a_source_is_the_servers_answer() {
    let status = ApiError::member_stopped("fatal").to_status();
    let e = classify_call_failure(&status);
    assert_eq!(e.code, ErrorCode::MemberStopped);
    assert!(e.is_member_fault());
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
        assert_eq!(&classify_call_failure(&status), e, "{}", e.code);
    }
    drop(server);
}

// ---------- transport failures ----------

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

/// One unary Forward call that must fail, classified.
async fn failed_call(addr: &str) -> (ApiError, Status) {
    let mut client = PeerClient::new(channel(addr));
    let request = Payload {
        data: b"compare-and-swap".to_vec(),
    };
    let status = tokio::time::timeout(BOUND, client.forward(request))
        .await
        .expect("bounded")
        .expect_err("the call must fail");
    (classify_call_failure(&status), status)
}

/// Serves every connection with `serve` until the test ends.
fn fake_server<F, Fut>(listener: TcpListener, serve: F) -> Task
where
    F: Fn(TcpStream) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    Task(tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            tokio::spawn(serve(socket));
        }
    }))
}

const HTTP2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const FRAME_DATA: u8 = 0x0;
const FRAME_HEADERS: u8 = 0x1;
const FLAG_END_STREAM: u8 = 0x1;
/// An empty SETTINGS frame, what a real server sends first.
const EMPTY_SETTINGS: [u8; 9] = [0, 0, 0, 0x4, 0, 0, 0, 0, 0];

/// Reads the client preface, answers with SETTINGS, then reads frames
/// until `stop(frame type, flags)` holds. Returns when it did, or when the
/// client went away first.
async fn read_request_until(socket: &mut TcpStream, stop: impl Fn(u8, u8) -> bool) {
    let mut preface = [0u8; 24];
    if socket.read_exact(&mut preface).await.is_err() || preface != HTTP2_PREFACE {
        return;
    }
    if socket.write_all(&EMPTY_SETTINGS).await.is_err() {
        return;
    }
    loop {
        let mut header = [0u8; 9];
        if socket.read_exact(&mut header).await.is_err() {
            return;
        }
        let len = u32::from_be_bytes([0, header[0], header[1], header[2]]) as usize;
        let mut payload = vec![0u8; len];
        if socket.read_exact(&mut payload).await.is_err() {
            return;
        }
        if stop(header[3], header[4]) {
            return;
        }
    }
}

/// (a) Nothing listens: the connection is refused, nothing was sent, and
/// a retry anywhere is safe.
#[tokio::test]
async fn a_refused_connection_is_safe_to_retry() {
    let (listener, addr) = listen().await;
    drop(listener);
    let (e, status) = failed_call(&addr).await;
    assert_eq!(e.code, ErrorCode::Unavailable, "{status:?}");
    assert_eq!(e.retry(), Retry::Safe);
    assert!(e.message.starts_with("the request was not sent: "), "{e}");
}

/// (b) The server accepts and closes at once, before reading a byte.
///
/// What is provable: the TCP connection was established, so tonic's
/// connector succeeded, and from then on the HTTP/2 client may write the
/// request into the socket before it learns of the close. A client cannot
/// tell this server from one that read the request, applied it and died
/// before answering, unless its own stack proves the request never reached
/// the connection. hyper gives that proof when the connection ends while
/// the request still waits in its dispatch queue ("canceled: connection
/// closed"); that is what loopback shows in practice, and it is Safe. When
/// the interleaving hands the request to the connection first, the close
/// looks exactly like (c) and is OutcomeUnknown. The test accepts those
/// two answers only, and Safe only with the proof in the chain.
#[tokio::test]
async fn an_accept_then_close_is_safe_only_with_proof() {
    let (listener, addr) = listen().await;
    let _server = fake_server(listener, |socket| async move { drop(socket) });
    let (e, status) = failed_call(&addr).await;
    match e.code {
        ErrorCode::WriteOutcomeUnknown => {}
        ErrorCode::Unavailable => assert_eq!(
            evidence(status.source().expect("a client-side status")),
            Evidence::NeverSent
        ),
        other => panic!("unexpected {other}: {status:?}"),
    }
    eprintln!("accept-then-close classified as {} ({status:?})", e.code);
}

/// (c) The server reads the preface and the request headers, then closes:
/// the request was sent, so its outcome is unknown.
#[tokio::test]
async fn a_close_after_the_request_headers_is_outcome_unknown() {
    let (listener, addr) = listen().await;
    let _server = fake_server(listener, |mut socket| async move {
        read_request_until(&mut socket, |kind, _| kind == FRAME_HEADERS).await;
    });
    let (e, status) = failed_call(&addr).await;
    assert_eq!(e.code, ErrorCode::WriteOutcomeUnknown, "{status:?}");
    assert_eq!(e.retry(), Retry::OutcomeUnknown);
}

/// (d) The server reads the whole request, then closes without a word:
/// exactly what a member that applied the write and crashed looks like.
#[tokio::test]
async fn a_close_after_the_whole_request_is_outcome_unknown() {
    let (listener, addr) = listen().await;
    let _server = fake_server(listener, |mut socket| async move {
        read_request_until(&mut socket, |kind, flags| {
            kind == FRAME_DATA && flags & FLAG_END_STREAM != 0
        })
        .await;
    });
    let (e, status) = failed_call(&addr).await;
    assert_eq!(e.code, ErrorCode::WriteOutcomeUnknown, "{status:?}");
    assert_eq!(e.retry(), Retry::OutcomeUnknown);
}

/// A server that reads the request and never answers: the client's
/// deadline fires, and a timeout's outcome is unknown.
#[tokio::test]
async fn a_silent_server_is_a_timeout() {
    let (listener, addr) = listen().await;
    let _server = fake_server(listener, |mut socket| async move {
        read_request_until(&mut socket, |_, _| false).await;
    });
    let mut client = PeerClient::new(channel(&addr));
    let mut request = tonic::Request::new(Payload { data: vec![1] });
    request.set_timeout(Duration::from_millis(300));
    let status = tokio::time::timeout(BOUND, client.forward(request))
        .await
        .expect("bounded")
        .expect_err("the call must time out");
    let e = classify_call_failure(&status);
    assert_eq!(e.code, ErrorCode::Timeout, "{status:?}");
    assert_eq!(e.retry(), Retry::OutcomeUnknown);
}

/// A server that refuses the stream (HTTP/2 REFUSED_STREAM, which RFC 9113
/// §8.7 says means "not processed"): safe to retry.
#[tokio::test]
async fn a_refused_stream_is_safe_to_retry() {
    let (listener, addr) = listen().await;
    let _server = fake_server(listener, |socket| async move {
        let Ok(mut conn) = h2::server::handshake(socket).await else {
            return;
        };
        while let Some(Ok((_request, mut respond))) = conn.accept().await {
            respond.send_reset(h2::Reason::REFUSED_STREAM);
        }
    });
    let (e, status) = failed_call(&addr).await;
    assert_eq!(e.code, ErrorCode::Unavailable, "{status:?}");
    assert_eq!(e.retry(), Retry::Safe);
}
