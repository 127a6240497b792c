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

use super::{connect, is_gone, ClientError, RefreshStream};
use crate::etcd_methods::lease;
use crate::etcdpb::{PbLeaseGrantRequest, PbLeaseGrantResponse};
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tonic::codegen::http::uri::PathAndQuery;

/// How long granting the lease may take on one endpoint. A grant commits
/// through Raft; across a leader election (2 s target) that still takes
/// well under 10 s.
const GRANT_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionState {
    /// Confirmed by the cell; `ttl` is the lease's TTL in seconds.
    Alive { ttl: i64 },
    /// Not confirmed for longer than a keep-alive interval.
    Jeopardy,
    /// Gone. Final.
    Expired,
}

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
    /// Grants a lease on the cell at `endpoints` (client addresses such as
    /// `http://127.0.0.1:7801` or `127.0.0.1:7801`, tried in order until
    /// one grants) and starts keeping it alive, first through the endpoint
    /// that granted it.
    pub async fn start(
        endpoints: &[String],
        options: SessionOptions,
    ) -> Result<Session, ClientError> {
        // Check every address before granting anything.
        RefreshStream::new(endpoints.iter().cloned())?;
        let mut failure = ClientError::NoEndpoint;
        for (i, addr) in endpoints.iter().enumerate() {
            let sent = Instant::now();
            let granted = match grant(addr, options.ttl).await {
                Ok(granted) => granted,
                Err(e) => {
                    failure = e;
                    continue;
                }
            };
            let stream = RefreshStream::new(endpoints[i..].iter().chain(&endpoints[..i]).cloned())?;
            let (tx, rx) = watch::channel(SessionState::Alive { ttl: granted.ttl });
            let keeper = Keeper {
                stream,
                lease: granted.id,
                options,
                last_confirmed: sent,
                state: tx,
            };
            return Ok(Session {
                lease: granted.id,
                state: rx,
                keeper: tokio::spawn(keeper.run()),
            });
        }
        Err(failure)
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

/// Grants a lease of `ttl` seconds on the member at `addr` with etcd's
/// `Lease/LeaseGrant`, within [`GRANT_TIMEOUT`].
async fn grant(addr: &str, ttl: i64) -> Result<PbLeaseGrantResponse, ClientError> {
    let call = async {
        let mut grpc = tonic::client::Grpc::new(connect(addr).await?);
        grpc.ready().await.map_err(|source| ClientError::Connect {
            addr: addr.to_string(),
            source,
        })?;
        let codec = tonic_prost::ProstCodec::<PbLeaseGrantRequest, PbLeaseGrantResponse>::default();
        let request = tonic::Request::new(PbLeaseGrantRequest { ttl, id: 0 });
        grpc.unary(request, PathAndQuery::from_static(lease::GRANT), codec)
            .await
            .map_err(|status| ClientError::rpc(addr, status))
    };
    let granted = tokio::time::timeout(GRANT_TIMEOUT, call)
        .await
        .map_err(|_| ClientError::TimedOut {
            addr: addr.to_string(),
            after: GRANT_TIMEOUT,
        })??
        .into_inner();
    if granted.id == 0 {
        return Err(ClientError::Malformed {
            addr: addr.to_string(),
            why: "granted lease 0".into(),
        });
    }
    Ok(granted)
}

/// The task that keeps one lease alive.
struct Keeper {
    stream: RefreshStream,
    lease: i64,
    options: SessionOptions,
    /// When the last confirmed refresh was sent.
    last_confirmed: Instant,
    state: watch::Sender<SessionState>,
}

enum Attempt {
    Alive(i64),
    Gone,
    Failed(ClientError),
}

impl Keeper {
    async fn run(mut self) {
        let ttl = Duration::from_secs(self.options.ttl.max(0) as u64);
        let mut next = Instant::now() + self.options.keep_alive;
        loop {
            tokio::time::sleep_until(next).await;
            let sent = Instant::now();
            match self.attempt().await {
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
                    // The stream has already moved on to another endpoint.
                    tracing::debug!(lease_id = %format!("{:x}", self.lease), %why, "refresh failed");
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

    /// One refresh of the lease, within the attempt timeout.
    async fn attempt(&mut self) -> Attempt {
        let reply = match self
            .stream
            .refresh(&[self.lease], self.options.attempt_timeout)
            .await
        {
            Ok(reply) => reply,
            Err(e) => return Attempt::Failed(e),
        };
        match reply.ttls.first() {
            Some(ttl) if !is_gone(*ttl) => Attempt::Alive(*ttl),
            Some(_) => Attempt::Gone,
            None => Attempt::Failed(ClientError::Malformed {
                addr: reply.endpoint,
                why: "an empty answer".into(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::fake_cell::{closed_addr, until, FakeCell, Fate, GRANTED};

    /// Far longer than any state change in these tests should take.
    const WAIT: Duration = Duration::from_secs(5);

    async fn wait_for(session: &Session, state: SessionState) -> Instant {
        let mut states = session.watch();
        let seen = tokio::time::timeout(WAIT, states.wait_for(|s| *s == state)).await;
        assert!(
            matches!(seen, Ok(Ok(_))),
            "never {state:?}; now {:?}",
            session.state()
        );
        Instant::now()
    }

    #[tokio::test]
    async fn a_lease_the_cell_reports_gone_expires_the_session() {
        let cell = FakeCell::start(1).await;
        let endpoints = [closed_addr(), cell.addr.clone()];
        let session = Session::start(&endpoints, SessionOptions::with_ttl(2))
            .await
            .expect("start");
        assert_eq!(session.lease_id(), GRANTED);
        assert_eq!(session.state(), SessionState::Alive { ttl: 2 });
        // The fake answers every refresh with a TTL of 10.
        wait_for(&session, SessionState::Alive { ttl: 10 }).await;
        cell.script().gone.insert(GRANTED);
        wait_for(&session, SessionState::Expired).await;
    }

    #[tokio::test]
    async fn a_silent_cell_puts_the_session_in_jeopardy_then_expires_it_after_the_ttl() {
        let cell = FakeCell::start(1).await;
        let session = Session::start(
            std::slice::from_ref(&cell.addr),
            SessionOptions::with_ttl(2),
        )
        .await
        .expect("start");
        wait_for(&session, SessionState::Alive { ttl: 10 }).await;
        let batches = cell.batches();
        cell.script().otherwise = Fate::Ignore;
        let silenced = Instant::now();
        // The last confirmed refresh was sent just before the silence (the
        // next is due a keep-alive interval, 667 ms, later): the lease lasts
        // 2 s from that send. The attempt under way at that moment may take
        // its whole timeout (333 ms) before the session sees it failed; the
        // rest of the upper bound is room for a loaded machine.
        wait_for(&session, SessionState::Jeopardy).await;
        let expired = wait_for(&session, SessionState::Expired).await;
        let after = expired.duration_since(silenced);
        assert!(
            after >= Duration::from_millis(1300) && after <= Duration::from_millis(3000),
            "expired {after:?} after the silence"
        );
        until("refreshes during the silence", || {
            cell.batches() > batches + 1
        })
        .await;
    }

    #[tokio::test]
    async fn a_session_needs_an_endpoint_that_grants() {
        let none: [String; 0] = [];
        let refused = Session::start(&none, SessionOptions::with_ttl(2)).await;
        assert!(matches!(refused, Err(ClientError::NoEndpoint)));
        let down = closed_addr();
        let failed = Session::start(std::slice::from_ref(&down), SessionOptions::with_ttl(2)).await;
        assert!(
            matches!(&failed, Err(ClientError::Connect { addr, .. }) if *addr == down),
            "{:?}",
            failed.map(|s| s.lease_id())
        );
    }
}
