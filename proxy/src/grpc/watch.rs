//! etcd v3 `Watch` through the coalescer: every client watch with the same
//! range, filters and prev_kv shares ONE upstream watch per proxy (DESIGN
//! section 4). Each client stream is served by one task that speaks
//! etcd's watch protocol to the client (its own watch ids, created and
//! cancelled answers, progress requests) and one forwarding task per
//! client watch that turns the shared watch's items into responses.
//!
//! A client watch dropped for reading too slowly is cancelled with a
//! reason naming the revision to resume from.

use crate::metrics_catalog::{SLOW_CLIENTS_CANCELLED, WATCH_STREAMS};
use crate::state::ProxyState;
use crate::upstream::{Kind, Route};
use crate::watch::client_watches::Held;
use crate::watch::fanout::Paced;
use crate::watch::{Cancel, Item, WatchKey};
use latchkey_shared::etcd_methods::maintenance::STATUS;
use latchkey_shared::etcdpb::{
    PbResponseHeader, PbStatusRequest, PbStatusResponse, PbWatchRequest, PbWatchRequestUnion,
    PbWatchResponse, PbWatchService,
};
use latchkey_shared::{ApiError, ErrorCode};
use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};

/// Responses queued per client stream before its tasks wait for the client.
const OUTBOUND_QUEUE: usize = 256;

/// How often a progress request asks the members again while the
/// stream's watches have not reached the revision it waits for.
const PROGRESS_POLL: std::time::Duration = std::time::Duration::from_millis(20);

pub struct WatchService {
    pub state: Arc<ProxyState>,
}

type Out = mpsc::Sender<Result<PbWatchResponse, Status>>;

#[tonic::async_trait]
impl PbWatchService for WatchService {
    type WatchStream =
        Pin<Box<dyn Stream<Item = Result<PbWatchResponse, Status>> + Send + 'static>>;

    async fn watch(
        &self,
        request: Request<Streaming<PbWatchRequest>>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let inbound = request.into_inner();
        let (out, rx) = mpsc::channel(OUTBOUND_QUEUE);
        let client = ClientStream {
            state: self.state.clone(),
            out,
            watches: HashMap::new(),
            next_id: 0,
        };
        metrics::gauge!(WATCH_STREAMS.name).increment(1.0);
        // The stream's task serves the client whose token opened it.
        let token = crate::ops::auth::client_token();
        self.state
            .lifecycle
            .spawn(crate::ops::auth::as_client(token, client.run(inbound)));
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }
}

/// One client watch: its forwarding task, the last revision it sent, and
/// its place among the proxy's client watches.
struct ClientWatch {
    forwarder: tokio::task::AbortHandle,
    sent_through: Arc<AtomicI64>,
    /// Whether its range is the home cell's (revisions are per cell).
    at_home: bool,
    _held: Held,
}

struct ClientStream {
    state: Arc<ProxyState>,
    out: Out,
    watches: HashMap<i64, ClientWatch>,
    next_id: i64,
}

impl ClientStream {
    async fn run(mut self, mut inbound: Streaming<PbWatchRequest>) {
        while let Some(Ok(request)) = inbound.next().await {
            if self.handle(request).await.is_err() {
                break;
            }
        }
        for (_, watch) in self.watches.drain() {
            watch.forwarder.abort();
        }
        metrics::gauge!(WATCH_STREAMS.name).decrement(1.0);
    }

    fn header(&self, revision: i64) -> PbResponseHeader {
        let mut header = self.state.upstream.home().last_header();
        header.revision = revision;
        header
    }

    /// The revision a progress answer may name: every watch of this stream
    /// has been sent everything up to it. It is at least the leader's
    /// revision when asked (a client that wrote and then asks for progress
    /// learns that its write has passed), unless that takes longer than
    /// the request timeout; then it is what the watches have reached.
    async fn progress(&self) -> i64 {
        let reached = || {
            self.watches
                .values()
                .map(|w| w.sent_through.load(Ordering::Relaxed))
                .min()
        };
        let cell = self.state.upstream.home();
        if self.watches.values().any(|w| !w.at_home) {
            // Watches of several cells: their revisions are not comparable,
            // so the answer is what every watch has reached.
            return reached().unwrap_or_else(|| cell.last_header().revision);
        }
        let target = cell
            .call::<_, PbStatusResponse>(Route::Leader, Kind::Read, STATUS, PbStatusRequest {})
            .await
            .ok()
            .and_then(|s| s.header)
            .map(|h| h.revision);
        let (Some(target), Some(_)) = (target, reached()) else {
            return reached().unwrap_or_else(|| cell.last_header().revision);
        };
        let deadline = tokio::time::Instant::now() + self.state.request_timeout;
        loop {
            let now = reached().unwrap_or(target);
            if now >= target || tokio::time::Instant::now() >= deadline {
                return now;
            }
            self.state.coalescers.home().request_progress().await;
            tokio::time::sleep(PROGRESS_POLL).await;
        }
    }

    async fn send(&self, response: PbWatchResponse) -> Result<(), ()> {
        self.out.send(Ok(response)).await.map_err(|_| ())
    }

    async fn handle(&mut self, request: PbWatchRequest) -> Result<(), ()> {
        match request.request_union {
            Some(PbWatchRequestUnion::CreateRequest(c)) => {
                let id = if c.watch_id > 0 {
                    c.watch_id
                } else {
                    while self.watches.contains_key(&self.next_id) {
                        self.next_id += 1;
                    }
                    self.next_id
                };
                let refuse = |reason: String| PbWatchResponse {
                    header: Some(self.header(self.state.upstream.home().last_header().revision)),
                    watch_id: id,
                    created: true,
                    canceled: true,
                    cancel_reason: reason,
                    ..Default::default()
                };
                if self.watches.contains_key(&id) {
                    let reason = latchkey_shared::ApiError::watch_id_exists()
                        .grpc_message()
                        .to_string();
                    return self.send(refuse(reason)).await;
                }
                let limits = &self.state.client_watches;
                if self.watches.len() >= limits.per_stream {
                    let refused = ApiError::too_many_watches("one stream", limits.per_stream);
                    return self.send(refuse(refused.message)).await;
                }
                let held = match limits.take("grpc") {
                    Ok(held) => held,
                    Err(e) => return self.send(refuse(e.message)).await,
                };
                // etcd reads an empty key as "\0".
                let key = if c.key.is_empty() { vec![0] } else { c.key };
                // The shared watch reads as the proxy: the cell first says
                // this client may read the range.
                let range = latchkey_shared::KeyRange::new(key.clone(), c.range_end.clone());
                let permit = match crate::ops::auth::read_permit(&self.state, &range).await {
                    Ok(permit) => permit,
                    Err(e) => return self.send(refuse(e.grpc_message().to_string())).await,
                };
                let watch_key = match WatchKey::new(key, c.range_end, &c.filters, c.prev_kv) {
                    Ok(k) => k,
                    Err(e) => return self.send(refuse(e.message)).await,
                };
                let coalescer = match self
                    .state
                    .coalescers
                    .for_range(&self.state.upstream, &watch_key.range)
                {
                    Ok(coalescer) => coalescer,
                    Err(e) => return self.send(refuse(e.grpc_message().to_string())).await,
                };
                let at_home = Arc::ptr_eq(&coalescer, self.state.coalescers.home());
                let subscription = match coalescer.subscribe(watch_key, c.start_revision).await {
                    Ok(subscription) => subscription,
                    // As etcd: the watch is created, then cancelled with the
                    // compact revision (etcd clients read a create refused
                    // with a reason as a failed stream, not as compaction).
                    Err(e) if e.code == ErrorCode::Compacted => {
                        let revision = self.state.upstream.home().last_header().revision;
                        self.send(PbWatchResponse {
                            header: Some(self.header(revision)),
                            watch_id: id,
                            created: true,
                            ..Default::default()
                        })
                        .await?;
                        return self
                            .send(PbWatchResponse {
                                header: Some(self.header(revision)),
                                watch_id: id,
                                canceled: true,
                                compact_revision: e.compact_revision().unwrap_or(0),
                                ..Default::default()
                            })
                            .await;
                    }
                    Err(e) => return self.send(refuse(e.grpc_message().to_string())).await,
                };
                let from = subscription.from;
                let created = PbWatchResponse {
                    header: Some(self.header(from - 1)),
                    watch_id: id,
                    created: true,
                    ..Default::default()
                };
                self.send(created).await?;
                let sent_through = Arc::new(AtomicI64::new(from - 1));
                let paced =
                    Paced::new(subscription, self.state.fanout.next_pace()).stands_on(permit);
                let forwarder = tokio::spawn(forward(
                    id,
                    paced,
                    self.out.clone(),
                    sent_through.clone(),
                    c.progress_notify,
                    self.header(0),
                ))
                .abort_handle();
                self.watches.insert(
                    id,
                    ClientWatch {
                        forwarder,
                        sent_through,
                        at_home,
                        _held: held,
                    },
                );
                Ok(())
            }
            Some(PbWatchRequestUnion::CancelRequest(c)) => {
                if let Some(watch) = self.watches.remove(&c.watch_id) {
                    watch.forwarder.abort();
                    let revision = watch.sent_through.load(Ordering::Relaxed);
                    self.send(PbWatchResponse {
                        header: Some(self.header(revision)),
                        watch_id: c.watch_id,
                        canceled: true,
                        ..Default::default()
                    })
                    .await?;
                }
                Ok(())
            }
            Some(PbWatchRequestUnion::ProgressRequest(_)) => {
                let revision = self.progress().await;
                self.send(PbWatchResponse {
                    header: Some(self.header(revision)),
                    watch_id: -1,
                    ..Default::default()
                })
                .await
            }
            None => Ok(()),
        }
    }
}

/// Turns one client watch's items into responses.
async fn forward(
    id: i64,
    mut items: Paced,
    out: Out,
    sent_through: Arc<AtomicI64>,
    progress_notify: bool,
    header: PbResponseHeader,
) {
    let at = |revision: i64| {
        let mut h = header;
        h.revision = revision;
        Some(h)
    };
    loop {
        // An event's revision counts as sent once its response is queued,
        // not before: a progress answer reads `sent_through`, and must not
        // name a revision whose events are still on their way (review P9).
        let mut sends_through = None;
        let response = match items.next().await {
            Some(Item::Events(r)) => {
                sends_through = Some(r.revision);
                PbWatchResponse {
                    header: at(r.revision),
                    watch_id: id,
                    events: r.events.to_vec(),
                    ..Default::default()
                }
            }
            Some(Item::Progress(revision)) => {
                let before = sent_through.fetch_max(revision, Ordering::Relaxed);
                if !progress_notify || revision <= before {
                    continue;
                }
                PbWatchResponse {
                    header: at(revision),
                    watch_id: id,
                    ..Default::default()
                }
            }
            Some(Item::Cancelled(Cancel::Compacted { compact_revision })) => PbWatchResponse {
                header: at(sent_through.load(Ordering::Relaxed)),
                watch_id: id,
                canceled: true,
                compact_revision,
                ..Default::default()
            },
            Some(Item::Cancelled(Cancel::Ended { reason })) => PbWatchResponse {
                header: at(sent_through.load(Ordering::Relaxed)),
                watch_id: id,
                canceled: true,
                cancel_reason: reason,
                ..Default::default()
            },
            Some(Item::Cancelled(Cancel::Revoked(refused))) => PbWatchResponse {
                header: at(sent_through.load(Ordering::Relaxed)),
                watch_id: id,
                canceled: true,
                cancel_reason: refused.grpc_message().to_string(),
                ..Default::default()
            },
            // Closed without a cancel: dropped for reading too slowly.
            None => {
                let resume_from = sent_through.load(Ordering::Relaxed) + 1;
                metrics::counter!(SLOW_CLIENTS_CANCELLED.name).increment(1);
                let _ = out
                    .send(Ok(PbWatchResponse {
                        header: at(resume_from - 1),
                        watch_id: id,
                        canceled: true,
                        cancel_reason: ApiError::watch_too_slow(resume_from).message,
                        ..Default::default()
                    }))
                    .await;
                return;
            }
        };
        let ends = response.canceled;
        if out.send(Ok(response)).await.is_err() || ends {
            return;
        }
        if let Some(revision) = sends_through {
            sent_through.store(revision, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::watch::coalescer::Subscription;
    use crate::watch::Revision;
    use std::time::Duration;

    #[tokio::test]
    async fn a_revision_counts_as_sent_only_once_its_response_is_queued() {
        let (items, subscription) = Subscription::from_channel(5, 4);
        let paced = Paced::new(subscription, Default::default());
        // The client's queue is full: the forwarder waits to send.
        let (out, mut responses) = mpsc::channel(1);
        out.send(Ok(PbWatchResponse::default()))
            .await
            .expect("queued");
        let sent_through = Arc::new(AtomicI64::new(4));
        let forwarder = tokio::spawn(forward(
            1,
            paced,
            out,
            sent_through.clone(),
            false,
            PbResponseHeader::default(),
        ));
        let revision = Revision {
            revision: 5,
            events: Arc::from(vec![Default::default()]),
            received: tokio::time::Instant::now(),
            herd: 1,
        };
        items.send(Item::Events(revision)).await.expect("sent");
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(
            sent_through.load(Ordering::Relaxed),
            4,
            "revision 5 counted as sent while its response waits for room"
        );
        let _first = responses.recv().await.expect("the first response");
        let event = responses.recv().await.expect("revision 5").expect("ok");
        assert_eq!(event.header.map(|h| h.revision), Some(5));
        latchkey_testkit::eventually(Duration::from_secs(5), async || {
            match sent_through.load(Ordering::Relaxed) {
                5 => Ok(()),
                n => Err(format!("sent through {n}")),
            }
        })
        .await;
        forwarder.abort();
    }
}
