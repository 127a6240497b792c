//! A client session: one lease kept alive through the cell's batched
//! refresh service, with its state observable as
//! `Alive { ttl } / Jeopardy / Expired`.
//!
//! - **Alive**: the last refresh was confirmed less than a keep-alive
//!   interval ago.
//! - **Jeopardy**: no refresh confirmed for longer than a keep-alive
//!   interval. The session keeps trying every endpoint it knows for the rest
//!   of the TTL; work guarded by the session's locks must stop now, because
//!   the cell may expire the lease at any moment from here on.
//! - **Expired**: the cell said the lease is gone, or the TTL ran out
//!   without a confirmed refresh. Final: the session stops refreshing.
//!
//! Deadlines count from when a refresh was *sent*, never from when its
//! answer arrived, so the session never believes in more time than the cell
//! granted.

use crate::sessions_pb::sessions_client::SessionsClient;
use crate::sessions_pb::{RefreshRequest, RefreshResponse};
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tonic::transport::{Channel, Endpoint};
use tonic::Streaming;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionState {
    /// Confirmed by the cell; `ttl` is the lease's TTL in seconds.
    Alive { ttl: i64 },
    /// Not confirmed for longer than a keep-alive interval.
    Jeopardy,
    /// Gone. Final.
    Expired,
}

#[derive(Debug, thiserror::Error)]
#[error("session: {0}")]
pub struct SessionError(String);

#[derive(Debug, Clone)]
pub struct SessionOptions {
    /// Lease TTL in seconds.
    pub ttl: i64,
    /// How often the lease is refreshed; a third of the TTL by default.
    pub keep_alive: Duration,
    /// How long one refresh attempt may take before the next endpoint is
    /// tried.
    pub attempt_timeout: Duration,
}

impl SessionOptions {
    pub fn with_ttl(ttl: i64) -> Self {
        let ttl_ms = (ttl.max(1) as u64) * 1000;
        SessionOptions {
            ttl,
            keep_alive: Duration::from_millis(ttl_ms / 3),
            attempt_timeout: Duration::from_millis((ttl_ms / 6).clamp(200, 2000)),
        }
    }
}

/// One lease, kept alive until the session is dropped or expires.
pub struct Session {
    lease: i64,
    state: watch::Receiver<SessionState>,
    keeper: JoinHandle<()>,
}

impl Session {
    /// Grants a lease on the cell at `endpoints` (client URLs such as
    /// `http://127.0.0.1:7801`) and starts keeping it alive.
    pub async fn start(
        endpoints: &[String],
        options: SessionOptions,
    ) -> Result<Session, SessionError> {
        if endpoints.is_empty() {
            return Err(SessionError("no endpoint given".into()));
        }
        let connect = etcd_client::ConnectOptions::new()
            .with_connect_timeout(options.attempt_timeout)
            .with_timeout(Duration::from_secs(10));
        let mut etcd = etcd_client::Client::connect(endpoints, Some(connect))
            .await
            .map_err(|e| SessionError(format!("connecting: {e}")))?;
        let sent = Instant::now();
        let granted = etcd
            .lease_grant(options.ttl, None)
            .await
            .map_err(|e| SessionError(format!("granting a lease: {e}")))?;
        let (tx, rx) = watch::channel(SessionState::Alive { ttl: granted.ttl() });
        let keeper = Keeper {
            endpoints: endpoints.to_vec(),
            next_endpoint: 0,
            stream: None,
            lease: granted.id(),
            options,
            last_confirmed: sent,
            batch: 0,
            state: tx,
        };
        Ok(Session {
            lease: granted.id(),
            state: rx,
            keeper: tokio::spawn(keeper.run()),
        })
    }

    /// The lease to attach ephemeral keys and locks to.
    pub fn lease_id(&self) -> i64 {
        self.lease
    }

    /// The state now.
    pub fn state(&self) -> SessionState {
        *self.state.borrow()
    }

    /// Every change of state, as a `watch` receiver.
    pub fn watch(&self) -> watch::Receiver<SessionState> {
        self.state.clone()
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        // The lease then expires at its TTL; revoke it first to end sooner.
        self.keeper.abort();
    }
}

/// An open refresh stream to one endpoint.
struct RefreshStream {
    requests: mpsc::Sender<RefreshRequest>,
    responses: Streaming<RefreshResponse>,
}

/// The task that keeps one lease alive.
struct Keeper {
    endpoints: Vec<String>,
    next_endpoint: usize,
    stream: Option<RefreshStream>,
    lease: i64,
    options: SessionOptions,
    /// When the last confirmed refresh was sent.
    last_confirmed: Instant,
    batch: u64,
    state: watch::Sender<SessionState>,
}

enum Attempt {
    Alive(i64),
    Gone,
    Failed(String),
}

impl Keeper {
    async fn run(mut self) {
        let ttl = Duration::from_secs(self.options.ttl.max(0) as u64);
        let mut next = Instant::now() + self.options.keep_alive;
        loop {
            tokio::time::sleep_until(next).await;
            let sent = Instant::now();
            let outcome =
                match tokio::time::timeout(self.options.attempt_timeout, self.attempt()).await {
                    Ok(outcome) => outcome,
                    Err(_) => Attempt::Failed("timed out".into()),
                };
            match outcome {
                Attempt::Alive(ttl) => {
                    self.last_confirmed = sent;
                    self.set(SessionState::Alive { ttl });
                    next = sent + self.options.keep_alive;
                }
                Attempt::Gone => {
                    self.set(SessionState::Expired);
                    return;
                }
                Attempt::Failed(why) => {
                    tracing::debug!(lease = self.lease, %why, "refresh failed; trying the next endpoint");
                    self.stream = None;
                    self.next_endpoint = (self.next_endpoint + 1) % self.endpoints.len();
                    let now = Instant::now();
                    if now >= self.last_confirmed + ttl {
                        self.set(SessionState::Expired);
                        return;
                    }
                    if now > self.last_confirmed + self.options.keep_alive {
                        self.set(SessionState::Jeopardy);
                    }
                    // Retry soon, but never past the TTL.
                    next = (now + Duration::from_millis(100)).min(self.last_confirmed + ttl);
                }
            }
            // A confirmed refresh older than the keep-alive interval means
            // jeopardy even when the attempts themselves are slow.
            if Instant::now()
                > self.last_confirmed + self.options.keep_alive + self.options.attempt_timeout
            {
                self.set(SessionState::Jeopardy);
            }
        }
    }

    fn set(&self, state: SessionState) {
        self.state.send_if_modified(|s| {
            let changed = *s != state;
            *s = state;
            changed
        });
    }

    async fn connect(&mut self) -> Result<&mut RefreshStream, String> {
        if self.stream.is_none() {
            let url = &self.endpoints[self.next_endpoint];
            let url = if url.contains("://") {
                url.clone()
            } else {
                format!("http://{url}")
            };
            let channel: Channel = Endpoint::from_shared(url.clone())
                .map_err(|e| format!("bad endpoint {url}: {e}"))?
                .connect_timeout(self.options.attempt_timeout)
                .connect()
                .await
                .map_err(|e| format!("connecting to {url}: {e}"))?;
            let (tx, rx) = mpsc::channel(4);
            let responses = SessionsClient::new(channel)
                .refresh(tokio_stream::wrappers::ReceiverStream::new(rx))
                .await
                .map_err(|e| format!("opening a refresh stream on {url}: {e}"))?
                .into_inner();
            self.stream = Some(RefreshStream {
                requests: tx,
                responses,
            });
        }
        self.stream.as_mut().ok_or_else(|| "no stream".to_string())
    }

    async fn attempt(&mut self) -> Attempt {
        self.batch += 1;
        let batch = self.batch;
        let lease = self.lease;
        let stream = match self.connect().await {
            Ok(s) => s,
            Err(e) => return Attempt::Failed(e),
        };
        let request = RefreshRequest {
            batch,
            ids: vec![lease],
        };
        if stream.requests.send(request).await.is_err() {
            return Attempt::Failed("the refresh stream closed".into());
        }
        loop {
            match stream.responses.message().await {
                Ok(Some(resp)) if resp.batch == batch => {
                    return match resp.ttls.first() {
                        Some(ttl) if *ttl > 0 => Attempt::Alive(*ttl),
                        Some(_) => Attempt::Gone,
                        None => Attempt::Failed("empty answer".into()),
                    };
                }
                // An answer to an earlier, timed-out attempt.
                Ok(Some(_)) => continue,
                Ok(None) => return Attempt::Failed("the refresh stream ended".into()),
                Err(status) => return Attempt::Failed(status.to_string()),
            }
        }
    }
}
