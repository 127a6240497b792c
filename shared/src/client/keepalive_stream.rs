//! [`KeepAliveStream`]: etcd's own `Lease/LeaseKeepAlive` stream, carrying
//! many leases at once.
//!
//! etcd's protocol refreshes one lease per message, and etcd client
//! libraries open one stream per lease. A proxy, a load test or a test
//! that keeps many leases alive on any etcd v3 server (a latchkey cell or
//! etcd itself) sends them all on one stream instead: one message per lease
//! per round, answered by one message per lease, `(id, ttl)`.
//!
//! The answers carry no round number, so an answer left over from a round
//! that was cut short (timed out, failed, cancelled) would look like an
//! answer to the next. A round that did not finish therefore makes the next
//! one start on a fresh stream to the same address.

use super::{connect_with, ClientError};
use crate::etcd_methods::lease;
use crate::etcdpb::{PbLeaseKeepAliveRequest, PbLeaseKeepAliveResponse};
use crate::tls::ClientTls;
use futures::StreamExt;
use std::collections::{BTreeMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::{timeout_at, Instant};
use tokio_stream::wrappers::ReceiverStream;
use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::Channel;
use tonic::Streaming;

/// Rounds queued before `refresh` waits for the transport to take them.
/// Rounds go one at a time, so one slot would do; the second keeps a
/// round from waiting on the tail of the previous one being written.
const ROUND_QUEUE: usize = 2;

type Answers = Streaming<PbLeaseKeepAliveResponse>;

/// The call, until the server sends its response headers. etcd (grpc-go)
/// sends them with its first answer, so the call is only awaited after the
/// first round has been queued.
type PendingCall = Pin<Box<dyn Future<Output = Result<Answers, ClientError>> + Send>>;

enum Responses {
    Pending(PendingCall),
    /// Boxed: a `Streaming` is over 200 bytes, the pending call 16.
    Open(Box<Answers>),
}

/// One `LeaseKeepAlive` stream to one member; see the module doc.
pub struct KeepAliveStream {
    addr: String,
    /// Each round's ids, sent as one keep-alive message per id.
    rounds: mpsc::Sender<Vec<i64>>,
    responses: Responses,
    /// False while a round is under way, and after one that did not finish.
    clean: bool,
}

impl KeepAliveStream {
    /// Connects to the etcd v3 server at `addr` (`host:port` or
    /// `http://host:port`). The stream itself starts with the first round.
    pub async fn open(addr: &str) -> Result<KeepAliveStream, ClientError> {
        KeepAliveStream::open_with(addr, None).await
    }

    /// As [`open`](KeepAliveStream::open), over TLS with `tls` when given.
    pub async fn open_with(
        addr: &str,
        tls: Option<&ClientTls>,
    ) -> Result<KeepAliveStream, ClientError> {
        let channel = connect_with(addr, tls).await?;
        Ok(KeepAliveStream::on(addr, channel))
    }

    fn on(addr: &str, channel: Channel) -> KeepAliveStream {
        let (rounds, queue) = mpsc::channel::<Vec<i64>>(ROUND_QUEUE);
        let requests = ReceiverStream::new(queue).flat_map(|ids| {
            futures::stream::iter(ids.into_iter().map(|id| PbLeaseKeepAliveRequest { id }))
        });
        let call_addr = addr.to_string();
        let call = async move {
            let mut grpc = tonic::client::Grpc::new(channel);
            grpc.ready().await.map_err(|source| ClientError::Connect {
                addr: call_addr.clone(),
                source,
            })?;
            let codec = tonic_prost::ProstCodec::<
                PbLeaseKeepAliveRequest,
                PbLeaseKeepAliveResponse,
            >::default();
            grpc.streaming(
                tonic::Request::new(requests),
                PathAndQuery::from_static(lease::KEEP_ALIVE),
                codec,
            )
            .await
            .map(tonic::Response::into_inner)
            .map_err(|status| ClientError::rpc(&call_addr, status))
        };
        KeepAliveStream {
            addr: addr.to_string(),
            rounds,
            responses: Responses::Pending(Box::pin(call)),
            clean: true,
        }
    }

    /// The address the stream is on.
    pub fn endpoint(&self) -> &str {
        &self.addr
    }

    /// Refreshes every lease in `ids` (each once, however often it is
    /// named) and returns the TTL answered for each; a lease that does not
    /// exist is answered 0 by etcd (see [`is_gone`](super::is_gone)).
    /// Fails unless every lease is answered within `timeout`.
    pub async fn refresh(
        &mut self,
        ids: &[i64],
        timeout: Duration,
    ) -> Result<BTreeMap<i64, i64>, ClientError> {
        match timeout_at(Instant::now() + timeout, self.round(ids)).await {
            Ok(result) => result,
            Err(_) => Err(ClientError::TimedOut {
                addr: self.addr.clone(),
                after: timeout,
            }),
        }
    }

    async fn round(&mut self, ids: &[i64]) -> Result<BTreeMap<i64, i64>, ClientError> {
        if ids.is_empty() {
            return Ok(BTreeMap::new());
        }
        if !self.clean {
            let addr = self.addr.clone();
            tracing::debug!(endpoint = %addr, "the last keep-alive round did not finish; reopening");
            *self = KeepAliveStream::open(&addr).await?;
        }
        self.clean = false;
        let mut unanswered = HashSet::with_capacity(ids.len());
        let round: Vec<i64> = ids
            .iter()
            .copied()
            .filter(|id| unanswered.insert(*id))
            .collect();
        self.rounds
            .send(round)
            .await
            .map_err(|_| ClientError::Closed {
                addr: self.addr.clone(),
            })?;
        if let Responses::Pending(call) = &mut self.responses {
            let answers = call.await?;
            self.responses = Responses::Open(Box::new(answers));
        }
        let Responses::Open(answers) = &mut self.responses else {
            return Err(ClientError::Closed {
                addr: self.addr.clone(),
            });
        };
        let mut ttls = BTreeMap::new();
        while !unanswered.is_empty() {
            match answers.message().await {
                // An id this round did not name is a leftover; skip it.
                Ok(Some(answer)) => {
                    if unanswered.remove(&answer.id) {
                        ttls.insert(answer.id, answer.ttl);
                    }
                }
                Ok(None) => {
                    return Err(ClientError::Closed {
                        addr: self.addr.clone(),
                    })
                }
                Err(status) => return Err(ClientError::rpc(&self.addr, status)),
            }
        }
        self.clean = true;
        Ok(ttls)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::fake_cell::{closed_addr, FakeCell, TIMEOUT};

    #[tokio::test]
    async fn many_leases_are_refreshed_on_one_stream() {
        // The fake, like etcd, sends no response headers before its first
        // answer: a client that waits for them before sending would hang.
        let cell = FakeCell::start(1).await;
        cell.script().gone.insert(3);
        let mut stream = KeepAliveStream::open(&cell.addr).await.expect("open");
        let ids: Vec<i64> = (1..=1000).chain([2]).collect();
        for round in 0..2 {
            let ttls = stream.refresh(&ids, TIMEOUT).await.expect("refresh");
            assert_eq!(ttls.len(), 1000, "round {round}");
            assert_eq!(ttls.get(&3), Some(&0));
            assert_eq!(ttls.values().filter(|t| **t == 10).count(), 999);
        }
        assert_eq!(cell.keep_alive_streams(), 1);
        let none = stream.refresh(&[], TIMEOUT).await.expect("nothing to do");
        assert!(none.is_empty());
    }

    #[tokio::test]
    async fn a_round_not_answered_in_time_fails_and_the_next_starts_a_fresh_stream() {
        let cell = FakeCell::start(1).await;
        cell.script().silent.insert(9);
        let mut stream = KeepAliveStream::open(&format!("http://{}", cell.addr))
            .await
            .expect("open");
        let started = Instant::now();
        let failed = stream.refresh(&[1, 9], Duration::from_millis(300)).await;
        assert!(
            matches!(failed, Err(ClientError::TimedOut { .. })),
            "{failed:?}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "the timeout held"
        );
        cell.script().silent.clear();
        let ttls = stream.refresh(&[1, 9], TIMEOUT).await.expect("refresh");
        assert_eq!(ttls, BTreeMap::from([(1, 10), (9, 10)]));
        assert_eq!(cell.keep_alive_streams(), 2);
    }

    #[tokio::test]
    async fn opening_on_a_closed_port_fails() {
        let addr = closed_addr();
        let failed = tokio::time::timeout(TIMEOUT, KeepAliveStream::open(&addr))
            .await
            .expect("bounded");
        assert!(matches!(failed, Err(ClientError::Connect { .. })));
    }
}
