//! A fake cell member on 127.0.0.1 for the client's tests. It serves
//! `Sessions.Refresh` and etcd's `Lease` service as its [`Script`] says:
//! batches answered, late, failed, closed or ignored; leases alive or gone;
//! a leader hint in every answer.

use crate::etcdpb::{
    PbLeaseGrantRequest, PbLeaseGrantResponse, PbLeaseKeepAliveRequest, PbLeaseKeepAliveResponse,
    PbLeaseLeasesRequest, PbLeaseLeasesResponse, PbLeaseRevokeRequest, PbLeaseRevokeResponse,
    PbLeaseServer, PbLeaseService, PbLeaseTimeToLiveRequest, PbLeaseTimeToLiveResponse,
};
use crate::sessions_pb::sessions_server::{Sessions, SessionsServer};
use crate::sessions_pb::{RefreshRequest, RefreshResponse};
use std::collections::{HashSet, VecDeque};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tokio_stream::Stream;
use tonic::{Request, Response, Status, Streaming};

/// The lease id the fake grants.
pub(crate) const GRANTED: i64 = 0x42;

/// What the fake does with one refresh batch.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) enum Fate {
    #[default]
    Answer,
    /// Answer after this long; later batches on the stream wait behind it.
    Late(Duration),
    /// Answer with an error status, which ends the stream.
    Fail,
    /// End the stream without answering.
    Close,
    /// Never answer; the stream stays open.
    Ignore,
}

#[derive(Debug, Default)]
pub(crate) struct Script {
    /// What every answer says besides its batch and TTLs: the member, the
    /// term, the cluster and the leader hint.
    pub says: RefreshResponse,
    /// The TTL of every lease not in `gone`.
    pub ttl: i64,
    /// Leases answered -1 by a refresh and 0 by a keep-alive.
    pub gone: HashSet<i64>,
    /// Leases whose keep-alives are never answered.
    pub silent: HashSet<i64>,
    /// The fates of the next refresh batches, in order; then `otherwise`.
    pub fates: VecDeque<Fate>,
    pub otherwise: Fate,
}

impl Script {
    fn answer(&self, request: &RefreshRequest) -> RefreshResponse {
        RefreshResponse {
            batch: request.batch,
            ttls: request
                .ids
                .iter()
                .map(|id| if self.gone.contains(id) { -1 } else { self.ttl })
                .collect(),
            ..self.says.clone()
        }
    }
}

#[derive(Default)]
struct Shared {
    /// A std mutex: it is held only to read or change the script, never
    /// across an `.await`.
    script: Mutex<Script>,
    batches: AtomicUsize,
    keep_alive_streams: AtomicUsize,
}

impl Shared {
    fn script(&self) -> MutexGuard<'_, Script> {
        self.script.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A running fake member; dropping it stops its server.
pub(crate) struct FakeCell {
    pub addr: String,
    shared: Arc<Shared>,
    server: JoinHandle<()>,
}

impl Drop for FakeCell {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl FakeCell {
    /// Member `member_id` of a cell in term 7, answering a TTL of 10 s for
    /// every lease; change that through [`script`](Self::script).
    pub(crate) async fn start(member_id: u64) -> FakeCell {
        let script = Script {
            says: RefreshResponse {
                member_id,
                raft_term: 7,
                ..RefreshResponse::default()
            },
            ttl: 10,
            ..Script::default()
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a fake cell");
        let addr = listener.local_addr().expect("local addr").to_string();
        let shared = Arc::new(Shared {
            script: Mutex::new(script),
            ..Shared::default()
        });
        let service = Service(shared.clone());
        let server = tokio::spawn(async move {
            let served = tonic::transport::Server::builder()
                .add_service(SessionsServer::new(service.clone()))
                .add_service(PbLeaseServer::new(service))
                .serve_with_incoming(TcpListenerStream::new(listener))
                .await;
            if let Err(e) = served {
                eprintln!("fake cell stopped: {e}");
            }
        });
        FakeCell {
            addr,
            shared,
            server,
        }
    }

    /// Changes the script from now on.
    pub(crate) fn script(&self) -> MutexGuard<'_, Script> {
        self.shared.script()
    }

    /// Refresh batches received so far.
    pub(crate) fn batches(&self) -> usize {
        self.shared.batches.load(Ordering::SeqCst)
    }

    /// Keep-alive streams opened so far.
    pub(crate) fn keep_alive_streams(&self) -> usize {
        self.shared.keep_alive_streams.load(Ordering::SeqCst)
    }
}

/// An address on 127.0.0.1 where nothing listens.
pub(crate) fn closed_addr() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("local addr").to_string()
}

#[derive(Clone)]
struct Service(Arc<Shared>);

type Unary<T> = Result<Response<T>, Status>;
type Answers<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl Sessions for Service {
    type RefreshStream = Answers<RefreshResponse>;

    async fn refresh(
        &self,
        request: Request<Streaming<RefreshRequest>>,
    ) -> Result<Response<Self::RefreshStream>, Status> {
        let mut inbound = request.into_inner();
        let (tx, rx) = mpsc::channel(16);
        let shared = self.0.clone();
        tokio::spawn(async move {
            while let Ok(Some(request)) = inbound.message().await {
                shared.batches.fetch_add(1, Ordering::SeqCst);
                let (fate, answer) = {
                    let mut script = shared.script();
                    let fate = script.fates.pop_front().unwrap_or(script.otherwise);
                    (fate, script.answer(&request))
                };
                match fate {
                    Fate::Answer => {}
                    Fate::Late(delay) => tokio::time::sleep(delay).await,
                    Fate::Fail => {
                        let _ = tx.send(Err(Status::unavailable("fake: failing"))).await;
                        return;
                    }
                    Fate::Close => return,
                    Fate::Ignore => continue,
                }
                if tx.send(Ok(answer)).await.is_err() {
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

#[tonic::async_trait]
impl PbLeaseService for Service {
    type LeaseKeepAliveStream = Answers<PbLeaseKeepAliveResponse>;

    async fn lease_grant(
        &self,
        request: Request<PbLeaseGrantRequest>,
    ) -> Unary<PbLeaseGrantResponse> {
        let granted = PbLeaseGrantResponse {
            id: GRANTED,
            ttl: request.into_inner().ttl,
            ..PbLeaseGrantResponse::default()
        };
        Ok(Response::new(granted))
    }

    async fn lease_revoke(&self, _: Request<PbLeaseRevokeRequest>) -> Unary<PbLeaseRevokeResponse> {
        Err(Status::unimplemented("fake"))
    }

    /// Like etcd, sends its response headers only with the first answer.
    async fn lease_keep_alive(
        &self,
        request: Request<Streaming<PbLeaseKeepAliveRequest>>,
    ) -> Result<Response<Self::LeaseKeepAliveStream>, Status> {
        self.0.keep_alive_streams.fetch_add(1, Ordering::SeqCst);
        let mut inbound = request.into_inner();
        let first = inbound.message().await?;
        let (tx, rx) = mpsc::channel(1024);
        let shared = self.0.clone();
        tokio::spawn(async move {
            let mut next = first;
            while let Some(PbLeaseKeepAliveRequest { id }) = next {
                let ttl = {
                    let script = shared.script();
                    if script.silent.contains(&id) {
                        None
                    } else if script.gone.contains(&id) {
                        Some(0)
                    } else {
                        Some(script.ttl)
                    }
                };
                if let Some(ttl) = ttl {
                    let answer = PbLeaseKeepAliveResponse {
                        header: None,
                        id,
                        ttl,
                    };
                    if tx.send(Ok(answer)).await.is_err() {
                        return;
                    }
                }
                next = inbound.message().await.ok().flatten();
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn lease_time_to_live(
        &self,
        _: Request<PbLeaseTimeToLiveRequest>,
    ) -> Unary<PbLeaseTimeToLiveResponse> {
        Err(Status::unimplemented("fake"))
    }

    async fn lease_leases(&self, _: Request<PbLeaseLeasesRequest>) -> Unary<PbLeaseLeasesResponse> {
        Err(Status::unimplemented("fake"))
    }
}

/// Far more than a loopback round trip, so only a bug reaches it.
pub(crate) const TIMEOUT: Duration = Duration::from_secs(5);

/// Waits until `condition` holds, polling every 10 ms; panics after 5 s.
pub(crate) async fn until(what: &str, condition: impl Fn() -> bool) {
    let waited = tokio::time::timeout(Duration::from_secs(5), async {
        while !condition() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(waited.is_ok(), "gave up waiting for {what}");
}
