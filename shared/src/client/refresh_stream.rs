//! [`RefreshStream`]: batched lease refresh on latchkey's
//! `latchkey.sessions.v1.Sessions/Refresh` stream.
//!
//! One request names every lease to refresh and carries a batch number; the
//! member echoes the number in its answer. [`RefreshStream::refresh`] sends
//! one batch and returns the answer with that number. Any other answer on
//! the stream belongs to an earlier batch whose caller gave up (a cancelled
//! `refresh`), and is dropped.
//!
//! The stream is open to one member at a time. When that member fails (a
//! connect error, a gRPC error, the stream ending, no answer in time) the
//! stream is dropped and the next batch goes to another member: the leader,
//! if the last answer named it and it is one of the endpoints, otherwise the
//! next endpoint in the list. Within one call, each endpoint is tried at
//! most once, and never after the call's deadline.
//!
//! `refresh` takes `&mut self`: one task owns the stream (the proxy's
//! keep-alive batcher, a [`Session`](super::Session)'s keeper). A cell
//! answers a stream's batches one after another, so two batches in flight
//! on one stream would not be answered sooner; callers that must share one
//! put it behind a `tokio::sync::Mutex`.

use super::{authority, connect_with, endpoint, ClientError, OwnCredentials};
use crate::limits::{MAX_REFRESH_BATCH, MAX_REFRESH_MESSAGE_BYTES};
use crate::sessions_pb::sessions_client::SessionsClient;
use crate::sessions_pb::{RefreshRequest, RefreshResponse};
use crate::tls::ClientTls;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::{timeout_at, Instant};
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;

/// Requests queued on a stream before `refresh` waits: the batch being sent,
/// and one left by a cancelled call that the transport has not taken yet.
const REQUEST_QUEUE: usize = 2;

/// The answer to one batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefreshReply {
    /// The batch number the answer echoed.
    pub batch: u64,
    /// One per requested id, in request order: the lease's TTL in seconds,
    /// counted from when the batch was sent, or -1 if the lease is gone
    /// (see [`is_gone`](super::is_gone)).
    pub ttls: Vec<i64>,
    /// The endpoint, as given to [`RefreshStream::new`], the stream was on.
    pub endpoint: String,
    /// The member that answered.
    pub member_id: u64,
    /// The leader's Raft term.
    pub raft_term: u64,
    /// The cell that answered; `None` if the member did not say.
    pub cluster_id: Option<u64>,
    /// The member id of the leader that served the batch, if known.
    pub leader_id: Option<u64>,
    /// The client URL of the leader that served the batch, if known.
    pub leader_client_url: Option<String>,
}

/// One endpoint of the cell.
#[derive(Debug)]
struct Member {
    /// As the caller gave it.
    addr: String,
    /// `host:port`, to recognise the address in a leader hint.
    authority: Option<String>,
    /// Learned from the answers this member gave.
    member_id: Option<u64>,
}

/// An open `Refresh` call on one member.
struct Open {
    requests: mpsc::Sender<RefreshRequest>,
    responses: Streaming<RefreshResponse>,
}

/// A batched refresh client over a cell's endpoints; see the module doc.
pub struct RefreshStream {
    members: Vec<Member>,
    /// Index into `members` of the member the stream is (or will be) on.
    current: usize,
    open: Option<Open>,
    /// The member the last answer named as the leader, to try first when
    /// the current one fails.
    leader: Option<usize>,
    /// The last batch number sent; each batch gets the next one.
    batch: u64,
    /// TLS towards the members, or plain text.
    tls: Option<ClientTls>,
    own_credentials: OwnCredentials,
}

impl RefreshStream {
    /// A refresh client over `endpoints` (`host:port` or `http://host:port`
    /// client addresses of one cell's members), starting with the first.
    /// Nothing is connected until the first [`refresh`](Self::refresh).
    pub fn new<I, S>(endpoints: I) -> Result<RefreshStream, ClientError>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let members = endpoints
            .into_iter()
            .map(|addr| {
                let addr = addr.into();
                endpoint(&addr)?;
                Ok(Member {
                    authority: authority(&addr),
                    addr,
                    member_id: None,
                })
            })
            .collect::<Result<Vec<_>, ClientError>>()?;
        if members.is_empty() {
            return Err(ClientError::NoEndpoint);
        }
        Ok(RefreshStream {
            members,
            current: 0,
            open: None,
            leader: None,
            batch: 0,
            tls: None,
            own_credentials: OwnCredentials::default(),
        })
    }

    /// The same client speaking TLS with `tls` (when given) to the members.
    pub fn with_tls(mut self, tls: Option<ClientTls>) -> RefreshStream {
        self.tls = tls;
        self
    }

    /// The same client presenting `token` when it opens a stream (the
    /// cell checks it then: batched refresh needs the root role once
    /// authentication is on).
    pub fn with_own_credentials(mut self, credentials: OwnCredentials) -> RefreshStream {
        self.own_credentials = credentials;
        self
    }

    /// The endpoint the next batch goes to.
    pub fn endpoint(&self) -> &str {
        &self.members[self.current].addr
    }

    /// Refreshes every lease in `ids` in one batch and returns the answer,
    /// trying other endpoints (each at most once) while `timeout` allows.
    ///
    /// On [`ClientError::TimedOut`] the stream has moved on to another
    /// endpoint; other errors are the last endpoint's failure. Cancelling
    /// the call is safe: the answer it leaves behind is dropped by the next.
    pub async fn refresh(
        &mut self,
        ids: &[i64],
        timeout: Duration,
    ) -> Result<RefreshReply, ClientError> {
        if ids.len() > MAX_REFRESH_BATCH {
            return Err(ClientError::BatchTooLarge {
                len: ids.len(),
                max: MAX_REFRESH_BATCH,
            });
        }
        let deadline = Instant::now() + timeout;
        let mut failure = ClientError::NoEndpoint;
        let mut tried = vec![false; self.members.len()];
        for _ in 0..self.members.len() {
            tried[self.current] = true;
            match timeout_at(deadline, self.attempt(ids)).await {
                Ok(Ok(reply)) => return Ok(reply),
                Ok(Err(e)) => {
                    tracing::debug!(endpoint = self.endpoint(), error = %e, "refresh failed; trying another endpoint");
                    self.rotate(&tried);
                    failure = e;
                }
                Err(_) => {
                    let addr = self.endpoint().to_string();
                    tracing::debug!(endpoint = %addr, ?timeout, "refresh timed out; trying another endpoint next");
                    self.rotate(&tried);
                    return Err(ClientError::TimedOut {
                        addr,
                        after: timeout,
                    });
                }
            }
        }
        Err(failure)
    }

    /// Sends one batch to the current member and waits for its answer.
    async fn attempt(&mut self, ids: &[i64]) -> Result<RefreshReply, ClientError> {
        self.batch += 1;
        let batch = self.batch;
        let request = RefreshRequest {
            batch,
            ids: ids.to_vec(),
        };
        let addr = self.members[self.current].addr.clone();
        match &self.open {
            Some(open) => open
                .requests
                .send(request)
                .await
                .map_err(|_| ClientError::Closed { addr: addr.clone() })?,
            None => {
                self.open = Some(
                    open_stream(&addr, self.tls.as_ref(), &self.own_credentials, request).await?,
                )
            }
        }
        let Some(open) = self.open.as_mut() else {
            return Err(ClientError::Closed { addr });
        };
        let answer = loop {
            match open.responses.message().await {
                Ok(Some(answer)) if answer.batch == batch => break answer,
                Ok(Some(stale)) if stale.batch < batch => {
                    tracing::debug!(endpoint = %addr, batch = stale.batch, "dropping the answer to an abandoned batch");
                }
                Ok(Some(other)) => {
                    return Err(ClientError::Malformed {
                        addr,
                        why: format!("an answer to batch {}, not yet sent", other.batch),
                    })
                }
                Ok(None) => return Err(ClientError::Closed { addr }),
                Err(status) => return Err(ClientError::rpc(&addr, status)),
            }
        };
        if answer.ttls.len() != ids.len() {
            return Err(ClientError::Malformed {
                addr,
                why: format!("{} TTLs for {} leases", answer.ttls.len(), ids.len()),
            });
        }
        self.learn(&answer);
        Ok(RefreshReply {
            batch,
            ttls: answer.ttls,
            endpoint: addr,
            member_id: answer.member_id,
            raft_term: answer.raft_term,
            cluster_id: Some(answer.cluster_id).filter(|id| *id != 0),
            leader_id: Some(answer.leader_id).filter(|id| *id != 0),
            leader_client_url: Some(answer.leader_client_url).filter(|url| !url.is_empty()),
        })
    }

    /// Remembers who answered and which endpoint, if any, is the leader.
    fn learn(&mut self, answer: &RefreshResponse) {
        if answer.member_id != 0 {
            self.members[self.current].member_id = Some(answer.member_id);
        }
        let hinted = authority(&answer.leader_client_url);
        self.leader = self.members.iter().position(|m| {
            (answer.leader_id != 0 && m.member_id == Some(answer.leader_id))
                || (hinted.is_some() && m.authority == hinted)
        });
    }

    /// Drops the stream; the next batch goes to the leader named by the
    /// last answer, else to the next endpoint in order, passing over those
    /// `tried` in this call while any other is left.
    fn rotate(&mut self, tried: &[bool]) {
        self.open = None;
        let n = self.members.len();
        let untried = |i: &usize| *i != self.current && !tried[*i];
        let leader = self.leader.take().filter(untried);
        let next = (1..=n).map(|k| (self.current + k) % n).find(untried);
        self.current = leader.or(next).unwrap_or((self.current + 1) % n);
    }
}

/// Opens a `Refresh` call on `addr` with `first` already queued: a server
/// may hold back its response headers until the first answer, so the call
/// cannot wait for them before sending.
async fn open_stream(
    addr: &str,
    tls: Option<&ClientTls>,
    own_credentials: &OwnCredentials,
    first: RefreshRequest,
) -> Result<Open, ClientError> {
    let channel = connect_with(addr, tls).await?;
    let (requests, queue) = mpsc::channel(REQUEST_QUEUE);
    requests.try_send(first).map_err(|_| ClientError::Closed {
        addr: addr.to_string(),
    })?;
    let mut request = tonic::Request::new(ReceiverStream::new(queue));
    own_credentials.attach(&mut request);
    let responses = SessionsClient::new(channel)
        .max_decoding_message_size(MAX_REFRESH_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_REFRESH_MESSAGE_BYTES)
        .refresh(request)
        .await
        .map_err(|status| ClientError::rpc(addr, status))?
        .into_inner();
    Ok(Open {
        requests,
        responses,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::fake_cell::{closed_addr, until, FakeCell, Fate, TIMEOUT};
    use crate::client::is_gone;

    #[tokio::test]
    async fn the_answer_to_an_abandoned_batch_is_dropped() {
        let cell = FakeCell::start(1).await;
        cell.script()
            .fates
            .push_back(Fate::Late(Duration::from_millis(200)));
        let mut stream = RefreshStream::new([cell.addr.clone()]).expect("endpoints");
        // The caller gives up on the first batch once the member has it.
        tokio::select! {
            early = stream.refresh(&[1], TIMEOUT) => panic!("the late batch was answered early: {early:?}"),
            _ = until("the first batch", || cell.batches() == 1) => {}
        }
        let reply = stream.refresh(&[1, 2], TIMEOUT).await.expect("refresh");
        assert_eq!(reply.batch, 2);
        assert_eq!(reply.ttls, vec![10, 10]);
        assert_eq!(cell.batches(), 2, "both batches went on one stream");
    }

    #[tokio::test]
    async fn a_gone_lease_is_answered_minus_one_in_request_order() {
        let cell = FakeCell::start(1).await;
        cell.script().gone.insert(7);
        cell.script().says.cluster_id = 99;
        let mut stream = RefreshStream::new([format!("http://{}", cell.addr)]).expect("endpoints");
        let reply = stream.refresh(&[5, 7, 9], TIMEOUT).await.expect("refresh");
        assert_eq!(reply.ttls, vec![10, -1, 10]);
        let gone: Vec<bool> = reply.ttls.iter().map(|t| is_gone(*t)).collect();
        assert_eq!(gone, [false, true, false]);
        assert_eq!((reply.member_id, reply.raft_term), (1, 7));
        assert_eq!(reply.cluster_id, Some(99));
        assert_eq!((reply.leader_id, reply.leader_client_url), (None, None));
    }

    #[tokio::test]
    async fn a_member_that_is_down_is_passed_over_within_one_call() {
        let cell = FakeCell::start(2).await;
        let mut stream = RefreshStream::new([closed_addr(), cell.addr.clone()]).expect("endpoints");
        let reply = stream.refresh(&[5], TIMEOUT).await.expect("refresh");
        assert_eq!(
            (reply.member_id, reply.endpoint.as_str()),
            (2, cell.addr.as_str())
        );
        assert_eq!(
            stream.endpoint(),
            cell.addr,
            "the stream stays where it works"
        );
    }

    #[tokio::test]
    async fn a_silent_member_times_out_and_the_next_batch_goes_to_the_next_endpoint() {
        let silent = FakeCell::start(1).await;
        silent.script().otherwise = Fate::Ignore;
        let cell = FakeCell::start(2).await;
        let mut stream =
            RefreshStream::new([silent.addr.clone(), cell.addr.clone()]).expect("endpoints");
        let started = Instant::now();
        let failed = stream.refresh(&[5], Duration::from_millis(300)).await;
        assert!(
            matches!(&failed, Err(ClientError::TimedOut { addr, .. }) if *addr == silent.addr),
            "{failed:?}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "the timeout held"
        );
        let reply = stream.refresh(&[5], TIMEOUT).await.expect("refresh");
        assert_eq!(reply.member_id, 2);
        assert_eq!(silent.batches(), 1);
    }

    #[tokio::test]
    async fn a_failing_member_is_left_for_the_leader_it_named() {
        let leader = FakeCell::start(3).await;
        let other = FakeCell::start(2).await;
        let follower = FakeCell::start(1).await;
        {
            let mut script = follower.script();
            script.says.leader_id = 3;
            script.says.leader_client_url = format!("http://{}", leader.addr);
            script.fates = [Fate::Answer, Fate::Fail].into();
        }
        let endpoints = [&follower.addr, &other.addr, &leader.addr];
        let mut stream = RefreshStream::new(endpoints.map(String::clone)).expect("endpoints");
        let first = stream.refresh(&[5], TIMEOUT).await.expect("refresh");
        assert_eq!(first.member_id, 1);
        assert_eq!(first.leader_id, Some(3));
        assert_eq!(
            first.leader_client_url,
            Some(format!("http://{}", leader.addr))
        );
        let second = stream.refresh(&[5], TIMEOUT).await.expect("refresh");
        assert_eq!(second.member_id, 3, "answered by the leader");
        assert_eq!(other.batches(), 0, "the next endpoint in order was skipped");
    }

    #[tokio::test]
    async fn one_call_tries_every_endpoint_once_the_named_leader_first() {
        let leader = FakeCell::start(3).await;
        leader.script().otherwise = Fate::Fail;
        let other = FakeCell::start(2).await;
        let follower = FakeCell::start(1).await;
        {
            let mut script = follower.script();
            script.says.leader_id = 3;
            script.says.leader_client_url = leader.addr.clone();
            script.fates = [Fate::Answer].into();
            script.otherwise = Fate::Fail;
        }
        let endpoints = [&follower.addr, &other.addr, &leader.addr];
        let mut stream = RefreshStream::new(endpoints.map(String::clone)).expect("endpoints");
        assert_eq!(stream.refresh(&[5], TIMEOUT).await.expect("1").member_id, 1);
        // The follower fails, then the leader it named: the third try goes
        // to the endpoint not tried yet, not back to the follower.
        let reply = stream.refresh(&[5], TIMEOUT).await.expect("2");
        assert_eq!(reply.member_id, 2);
        assert_eq!((follower.batches(), leader.batches()), (2, 1));
    }

    #[tokio::test]
    async fn a_leader_hint_is_recognised_by_member_id_however_its_url_is_spelled() {
        let leader = FakeCell::start(3).await;
        leader.script().fates = [Fate::Answer, Fate::Close].into();
        let port = leader.addr.rsplit_once(':').map(|(_, p)| p.to_string());
        let follower = FakeCell::start(2).await;
        {
            let mut script = follower.script();
            script.says.leader_id = 3;
            script.says.leader_client_url =
                format!("http://localhost:{}", port.unwrap_or_default());
            script.fates = [Fate::Answer, Fate::Fail].into();
        }
        let other = FakeCell::start(1).await;
        let endpoints = [&leader.addr, &follower.addr, &other.addr];
        let mut stream = RefreshStream::new(endpoints.map(String::clone)).expect("endpoints");
        // The leader answers (its id is learned), then ends the stream: the
        // batch is retried on the follower, which names member 3 as leader.
        assert_eq!(stream.refresh(&[5], TIMEOUT).await.expect("1").member_id, 3);
        assert_eq!(stream.refresh(&[5], TIMEOUT).await.expect("2").member_id, 2);
        // The follower fails: back to the leader, not on to the third.
        assert_eq!(stream.refresh(&[5], TIMEOUT).await.expect("3").member_id, 3);
        assert_eq!(other.batches(), 0);
    }

    #[tokio::test]
    async fn when_every_endpoint_fails_the_call_ends_with_the_last_failure() {
        let closing = FakeCell::start(1).await;
        closing.script().otherwise = Fate::Close;
        let down = closed_addr();
        let mut stream =
            RefreshStream::new([closing.addr.clone(), down.clone()]).expect("endpoints");
        let failed = tokio::time::timeout(TIMEOUT, stream.refresh(&[5], TIMEOUT))
            .await
            .expect("no wait for the deadline");
        assert!(
            matches!(&failed, Err(ClientError::Connect { addr, .. }) if *addr == down),
            "{failed:?}"
        );
        assert_eq!(closing.batches(), 1, "each endpoint once");
    }

    #[tokio::test]
    async fn batches_over_the_limit_and_bad_endpoints_are_refused_before_any_io() {
        let mut stream = RefreshStream::new(["127.0.0.1:1"]).expect("endpoints");
        let big = vec![1; MAX_REFRESH_BATCH + 1];
        let refused = stream.refresh(&big, TIMEOUT).await;
        assert!(
            matches!(refused, Err(ClientError::BatchTooLarge { len, .. }) if len == MAX_REFRESH_BATCH + 1),
            "{refused:?}"
        );
        assert!(matches!(
            RefreshStream::new(Vec::<String>::new()),
            Err(ClientError::NoEndpoint)
        ));
        assert!(matches!(
            RefreshStream::new(["127.0.0.1:1", "ftp://x:1"]),
            Err(ClientError::InvalidEndpoint { .. })
        ));
    }
}
