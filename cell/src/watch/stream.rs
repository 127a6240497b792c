//! One etcd watch stream: many watches multiplexed on one gRPC stream, all
//! served by one task that owns their state (no locks).
//!
//! Every watch has `next_rev`, the first revision it may be sent. The
//! stream has `seen`, the last revision it took from the hub. Invariant
//! between steps: every watch has been sent what it wants up to `seen`, and
//! is owed every revision from `max(next_rev, seen + 1)` on (a live revision
//! moves `seen`, not each watch), so a live revision from the hub goes to
//! exactly the watches that still need it, and no revision is sent twice or
//! skipped:
//!
//! - a new watch from a past revision is first sent `next_rev..=seen` from
//!   history (a clone of the keyspace, O(1) to take), then lives on the hub;
//! - when the stream lags the hub's ring (its client reads slowly) or the
//!   state is replaced by a snapshot, it re-subscribes, and every watch is
//!   sent `next_rev..=now` from history before going live again; a watch
//!   whose `next_rev` was compacted meanwhile is cancelled with the compact
//!   revision, as etcd does.

use super::outbound::Outbound;
use super::watch_set::{Watch, WatchSet};
use crate::metrics_catalog::{
    WATCHERS, WATCH_COMMIT_TO_SEND_SECONDS, WATCH_EVENTS_SENT, WATCH_SLOW_STREAMS, WATCH_STREAMS,
    WATCH_STREAMS_ENDED_NO_LEADER,
};
use crate::mvcc::history::History;
use crate::mvcc::keyspace::{Event, EventKind, KeyRange};
use crate::mvcc::range::to_pb;
use crate::node::CellNode;
use crate::ops::auth_gate::AuthGate;
use crate::state_machine::watch_hub::{Changes, Notice};
use latchkey_shared::auth::{Caller, Need};
use latchkey_shared::directory::Ownership;
use latchkey_shared::etcd_enums::{EventType, FilterType};
use latchkey_shared::etcdpb::{PbEvent, PbWatchRequest, PbWatchRequestUnion, PbWatchResponse};
use latchkey_shared::ApiError;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::broadcast;
use tokio_stream::{Stream, StreamExt};
use tonic::Status;

/// The watch id etcd uses for responses that belong to no single watch.
const NO_WATCH: i64 = -1;
/// Hub notices taken in one go and sent as one response per watch.
const MAX_REVISIONS_PER_BATCH: usize = 1000;
/// While revisions arrive densely (the last send was less than this ago)
/// AND the client has not yet taken the last response, a stream gathers
/// them for up to this long and sends them together. A client that keeps
/// up gets every change at once (a proxy multiplexing many watches on one
/// stream sees a send every few ms; lingering then delayed every lock
/// handover by up to 5 ms). This keeps a busy stream to a slow reader
/// from sending thousands of tiny HTTP/2 DATA frames, which h2 clients
/// count against a budget and answer with GOAWAY.
const LINGER: Duration = Duration::from_millis(5);

/// Limits and intervals for every watch stream of a member.
#[derive(Debug, Clone)]
pub struct WatchOptions {
    /// How often an idle watch that asked for progress notifications gets one.
    pub progress_interval: Duration,
    /// Watches one stream may hold.
    pub max_watches: usize,
    /// A response is split at revision boundaries past this size, and a
    /// watch that asked for fragments gets one revision's events in pieces.
    pub max_response_bytes: usize,
}

/// The client went away: stop serving the stream.
struct Gone;

pub struct WatchStream {
    node: Arc<CellNode>,
    options: WatchOptions,
    rx: broadcast::Receiver<Arc<Notice>>,
    /// The last revision taken from the hub (or caught up to from history).
    seen: i64,
    watches: WatchSet,
    next_id: i64,
    out: Outbound,
    /// When live changes were last sent.
    last_sent: tokio::time::Instant,
    /// The client asked for require-leader: the stream ends with
    /// `no_leader` once the member has lost its leader.
    require_leader: bool,
    /// Who opened the stream, checked again every [`AUTH_RECHECK`].
    gate: Arc<AuthGate>,
    caller: Caller,
}

/// How often a stream checks its caller's permissions again: a revoked
/// permission ends its watches within this, a deleted user its stream.
const AUTH_RECHECK: Duration = Duration::from_secs(1);

fn to_pb_event(event: &Event, with_prev: bool) -> PbEvent {
    PbEvent {
        r#type: match event.kind {
            EventKind::Put => EventType::Put as i32,
            EventKind::Delete => EventType::Delete as i32,
        },
        kv: Some(to_pb(&event.kv, false)),
        prev_kv: if with_prev {
            event.prev.as_ref().map(|kv| to_pb(kv, false))
        } else {
            None
        },
    }
}

impl WatchStream {
    /// A stream of this member. Subscribes to the hub before reading the
    /// state, so every later revision reaches it.
    pub fn new(
        node: Arc<CellNode>,
        options: WatchOptions,
        out: Outbound,
        require_leader: bool,
        (gate, caller): (Arc<AuthGate>, Caller),
    ) -> Self {
        let rx = node.watch_hub.subscribe();
        let seen = node.state.read(|s| s.keys.revision());
        metrics::gauge!(WATCH_STREAMS.name).increment(1.0);
        WatchStream {
            node,
            options,
            rx,
            seen,
            watches: WatchSet::default(),
            next_id: 0,
            out,
            last_sent: tokio::time::Instant::now() - LINGER,
            require_leader,
            gate,
            caller,
        }
    }

    /// Serves the stream until the client closes it or goes away.
    pub async fn run(
        mut self,
        mut inbound: impl Stream<Item = Result<PbWatchRequest, Status>> + Unpin,
    ) {
        let mut tick = tokio::time::interval(self.options.progress_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        let mut leader_check = tokio::time::interval(self.node.require_leader_after / 4);
        leader_check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut auth_check = tokio::time::interval(AUTH_RECHECK);
        auth_check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let step = tokio::select! {
                request = inbound.next() => match request {
                    Some(Ok(request)) => self.handle(request).await,
                    // Closed by the client, or the connection broke.
                    _ => Err(Gone),
                },
                notice = self.rx.recv() => self.on_notice(notice).await,
                _ = tick.tick() => self.progress().await,
                _ = leader_check.tick(), if self.require_leader => self.check_leader().await,
                _ = auth_check.tick() => self.check_auth().await,
            };
            if step.is_err() {
                return;
            }
        }
    }

    /// Ends a require-leader stream whose member has lost its leader, as
    /// etcd does: with `no_leader` (its client resumes on another member),
    /// sent within a request timeout if the client is not reading.
    async fn check_leader(&self) -> Result<(), Gone> {
        if !self.node.leader_lost() {
            return Ok(());
        }
        metrics::counter!(WATCH_STREAMS_ENDED_NO_LEADER.name).increment(1);
        let ended = self.out.send(Err(ApiError::no_leader().into()));
        let _ = tokio::time::timeout(self.node.request_timeout, ended).await;
        Err(Gone)
    }

    /// Checks the caller against the auth records as they are now: a
    /// caller that is no longer valid (user deleted, authentication turned
    /// on under an anonymous stream) ends the stream with the error; a
    /// watch whose range is no longer readable is cancelled, saying why.
    async fn check_auth(&mut self) -> Result<(), Gone> {
        match self.gate.recheck(&self.caller) {
            Err(e) => {
                let ended = self.out.send(Err(e.into()));
                let _ = tokio::time::timeout(self.node.request_timeout, ended).await;
                Err(Gone)
            }
            Ok(caller) => {
                self.caller = caller;
                // A range the cell no longer owns (the directory moved it)
                // is cancelled as a revoked one is: its client re-reads
                // through the cell that owns it now.
                let ownership = self.node.state.read(|s| s.keys.ownership().cloned());
                self.cancel_refused(ownership.as_ref()).await
            }
        }
    }

    /// Cancels every watch whose range the caller may no longer read or
    /// the cell no longer owns by `ownership`, saying why.
    async fn cancel_refused(&mut self, ownership: Option<&Ownership>) -> Result<(), Gone> {
        let revoked: Vec<(i64, String)> = self
            .watches
            .iter()
            .filter_map(|(id, w)| {
                let refused = self
                    .caller
                    .require(Need::Read, &w.range)
                    .and_then(|()| ownership.map_or(Ok(()), |o| o.check_read(&w.range)))
                    .err()?;
                Some((id, refused.grpc_message().to_string()))
            })
            .collect();
        for (id, reason) in revoked {
            if self.watches.remove(id).is_some() {
                metrics::gauge!(WATCHERS.name).decrement(1.0);
            }
            let mut resp = self.response(id, self.seen);
            resp.canceled = true;
            resp.cancel_reason = reason;
            self.send(resp).await?;
        }
        Ok(())
    }

    async fn send(&self, response: PbWatchResponse) -> Result<(), Gone> {
        self.out.send(Ok(response)).await.map_err(|_| Gone)
    }

    fn response(&self, watch_id: i64, revision: i64) -> PbWatchResponse {
        PbWatchResponse {
            header: Some(self.node.header(revision)),
            watch_id,
            ..Default::default()
        }
    }

    async fn handle(&mut self, request: PbWatchRequest) -> Result<(), Gone> {
        match request.request_union {
            Some(PbWatchRequestUnion::CreateRequest(create)) => {
                let filters = &create.filters;
                let watch = Watch {
                    range: if create.key.is_empty() {
                        // etcd reads an empty key as "\0".
                        KeyRange::new(vec![0], create.range_end)
                    } else {
                        KeyRange::new(create.key, create.range_end)
                    },
                    next_rev: create.start_revision.max(0),
                    no_put: filters.contains(&(FilterType::NoPut as i32)),
                    no_delete: filters.contains(&(FilterType::NoDelete as i32)),
                    prev_kv: create.prev_kv,
                    progress_notify: create.progress_notify,
                    fragment: create.fragment,
                    idle: true,
                };
                self.create(create.watch_id, watch).await
            }
            Some(PbWatchRequestUnion::CancelRequest(cancel)) => {
                if self.watches.remove(cancel.watch_id).is_some() {
                    metrics::gauge!(WATCHERS.name).decrement(1.0);
                    let mut resp = self.response(cancel.watch_id, self.seen);
                    resp.canceled = true;
                    self.send(resp).await?;
                }
                Ok(())
            }
            Some(PbWatchRequestUnion::ProgressRequest(_)) => {
                // Every watch has been sent everything up to `seen`.
                self.send(self.response(NO_WATCH, self.seen)).await
            }
            None => Ok(()),
        }
    }

    async fn refuse(&self, reason: String) -> Result<(), Gone> {
        let mut resp = self.response(NO_WATCH, self.seen);
        resp.created = true;
        resp.canceled = true;
        resp.cancel_reason = reason;
        self.send(resp).await
    }

    async fn create(&mut self, requested_id: i64, mut watch: Watch) -> Result<(), Gone> {
        if let Err(refused) = self.caller.require(Need::Read, &watch.range) {
            return self.refuse(refused.grpc_message().to_string()).await;
        }
        let owned = self
            .node
            .state
            .read(|s| s.keys.check_owned(&watch.range.start, &watch.range.end));
        if let Err(refused) = owned {
            return self.refuse(refused.grpc_message().to_string()).await;
        }
        if self.watches.len() >= self.options.max_watches {
            let refused = ApiError::too_many_watches("one stream", self.options.max_watches);
            return self.refuse(refused.message).await;
        }
        let id = if requested_id == 0 {
            while self.watches.contains(self.next_id) {
                self.next_id += 1;
            }
            self.next_id
        } else if requested_id < 0 {
            return self.refuse("watch id must not be negative".into()).await;
        } else if self.watches.contains(requested_id) {
            return self.refuse(ApiError::watch_id_exists().message).await;
        } else {
            requested_id
        };
        if requested_id == 0 {
            self.next_id += 1;
        }
        let (current, compacted) = self.node.state.read(|s| {
            (
                s.keys.revision(),
                s.keys.compacted_for(&watch.range.start, &watch.range.end),
            )
        });
        if watch.next_rev == 0 {
            watch.next_rev = current + 1;
        }
        let mut created = self.response(id, current);
        created.created = true;
        self.send(created).await?;
        if watch.next_rev < compacted {
            return self.cancel_compacted(id, compacted).await;
        }
        metrics::gauge!(WATCHERS.name).increment(1.0);
        self.watches.insert(id, watch);
        if self
            .watches
            .get(id)
            .is_some_and(|w| w.next_rev <= self.seen)
        {
            self.catch_up(&[id], self.seen).await?;
        }
        Ok(())
    }

    async fn cancel_compacted(&mut self, id: i64, compact_revision: i64) -> Result<(), Gone> {
        if self.watches.remove(id).is_some() {
            metrics::gauge!(WATCHERS.name).decrement(1.0);
        }
        let mut resp = self.response(id, self.seen.max(compact_revision));
        resp.canceled = true;
        resp.compact_revision = compact_revision;
        resp.cancel_reason = ApiError::compacted(compact_revision).message;
        self.send(resp).await
    }

    /// Sends the watches `ids` everything from their `next_rev` to `upto`
    /// out of history. The keyspace clone's revision is at least `upto`,
    /// which is at most what has been applied. History is read one
    /// response's worth at a time (cell review P3): a watch from revision 1
    /// over a large history holds one batch in memory, not all of it.
    async fn catch_up(&mut self, ids: &[i64], upto: i64) -> Result<(), Gone> {
        let keys = self.node.state.read(|s| s.keys.clone());
        for id in ids {
            let Some(watch) = self.watches.get(*id) else {
                continue;
            };
            if watch.next_rev > upto {
                continue;
            }
            if watch.next_rev < keys.compact_revision() {
                self.cancel_compacted(*id, keys.compact_revision()).await?;
                continue;
            }
            // History past the cell's giving the range away is not the
            // range's (the old copy dropped, a later move's copy coming in):
            // the watch gets what comes before and is then cancelled, as a
            // live one is at that revision.
            let unowned = first_unowned(&keys, &watch.range, watch.next_rev, upto);
            let until = unowned.as_ref().map_or(upto, |(at, _)| *at);
            let mut history =
                History::new(&keys, &watch.range, watch.next_rev, until, watch.prev_kv);
            while !history.is_done() {
                let batch = history.next_batch(self.options.max_response_bytes);
                let Some(watch) = self.watches.get_mut(*id) else {
                    break;
                };
                let last = match history.is_done() {
                    true => until,
                    false => batch.last().map_or(until, Event::revision),
                };
                let events: Vec<Event> = batch.into_iter().filter(|e| watch.wants(e)).collect();
                self.send_events(*id, &events, last).await?;
                if let Some(watch) = self.watches.get_mut(*id) {
                    watch.next_rev = last + 1;
                }
            }
            if let Some((_, reason)) = unowned {
                if self.watches.remove(*id).is_some() {
                    metrics::gauge!(WATCHERS.name).decrement(1.0);
                }
                let mut resp = self.response(*id, until);
                resp.canceled = true;
                resp.cancel_reason = reason;
                self.send(resp).await?;
                continue;
            }
            if let Some(watch) = self.watches.get_mut(*id) {
                watch.next_rev = upto + 1;
            }
        }
        Ok(())
    }

    async fn on_notice(
        &mut self,
        notice: Result<Arc<Notice>, broadcast::error::RecvError>,
    ) -> Result<(), Gone> {
        let first = match notice {
            Ok(n) => n,
            Err(broadcast::error::RecvError::Lagged(missed)) => {
                metrics::counter!(WATCH_SLOW_STREAMS.name).increment(1);
                tracing::debug!(missed, "watch stream fell behind; catching up from history");
                return self.resync().await;
            }
            Err(broadcast::error::RecvError::Closed) => return Err(Gone),
        };
        // Take what else is already there, so a busy stream sends one
        // response per watch for many revisions.
        let mut batch = Vec::new();
        let mut then_resync = false;
        let mut next = Some(first);
        while let Some(notice) = next.take() {
            match &*notice {
                Notice::Changes(_) => batch.push(notice),
                Notice::Reset => {
                    then_resync = true;
                    break;
                }
            }
            if batch.len() >= MAX_REVISIONS_PER_BATCH {
                break;
            }
            let linger_until = self.last_sent + LINGER;
            let reader_behind = self.out.reader_behind();
            let more = if reader_behind && tokio::time::Instant::now() < linger_until {
                tokio::time::timeout_at(linger_until, self.rx.recv())
                    .await
                    .unwrap_or(Err(broadcast::error::RecvError::Closed))
            } else {
                self.rx.try_recv().map_err(|e| match e {
                    broadcast::error::TryRecvError::Lagged(n) => {
                        broadcast::error::RecvError::Lagged(n)
                    }
                    _ => broadcast::error::RecvError::Closed,
                })
            };
            match more {
                Ok(n) => next = Some(n),
                Err(broadcast::error::RecvError::Lagged(_)) => {
                    metrics::counter!(WATCH_SLOW_STREAMS.name).increment(1);
                    then_resync = true;
                }
                // Nothing more now (a real close shows on the next recv).
                Err(broadcast::error::RecvError::Closed) => {}
            }
        }
        let changes: Vec<&Changes> = batch
            .iter()
            .filter_map(|n| match &**n {
                Notice::Changes(c) if c.revision > self.seen => Some(c),
                _ => None,
            })
            .collect();
        self.deliver(&changes).await?;
        if then_resync {
            self.resync().await?;
        }
        Ok(())
    }

    /// Sends live revisions to the watches that want them. A revision that
    /// changes the cell's ownership record ends, right after it, every
    /// watch of a range the new record does not own: nothing the cell
    /// applies later under that range (a later move's copy coming in, on a
    /// member that was behind when the watch was made) reaches it.
    async fn deliver(&mut self, changes: &[&Changes]) -> Result<(), Gone> {
        let mut from = 0;
        for (i, c) in changes.iter().enumerate() {
            if let Some(ownership) = new_ownership(c) {
                self.deliver_run(&changes[from..=i]).await?;
                self.cancel_refused(Some(&ownership)).await?;
                from = i + 1;
            }
        }
        self.deliver_run(&changes[from..]).await
    }

    /// [`deliver`](Self::deliver) of revisions that change no ownership.
    async fn deliver_run(&mut self, changes: &[&Changes]) -> Result<(), Gone> {
        let Some(last) = changes.last().map(|c| c.revision) else {
            return Ok(());
        };
        let mut pending: HashMap<i64, Vec<Event>> = HashMap::new();
        for c in changes {
            for event in &c.events {
                for id in self.watches.wanting(event) {
                    pending.entry(id).or_default().push(event.clone());
                }
            }
        }
        // Every watch is now owed what comes after `last` (its `next_rev`
        // stays where it was: see the module's invariant).
        self.seen = last;
        if !pending.is_empty() {
            self.last_sent = tokio::time::Instant::now();
        }
        for (id, events) in pending {
            self.send_events(id, &events, last).await?;
        }
        if let Some(first) = changes.first() {
            metrics::histogram!(WATCH_COMMIT_TO_SEND_SECONDS.name)
                .record(first.applied_at.elapsed().as_secs_f64());
        }
        Ok(())
    }

    /// Starts over from the hub's present: every watch is caught up from
    /// history to the revision the state has now.
    async fn resync(&mut self) -> Result<(), Gone> {
        self.rx = self.rx.resubscribe();
        let upto = self.node.state.read(|s| s.keys.revision());
        // History from where each watch is owed, which live revisions
        // moved by `seen` alone.
        let owed = self.seen + 1;
        for watch in self.watches.values_mut() {
            watch.next_rev = watch.next_rev.max(owed);
        }
        let ids = self.watches.ids();
        self.catch_up(&ids, upto).await?;
        self.seen = upto;
        Ok(())
    }

    /// One watch's events, in responses that keep each revision whole and
    /// stay under the size limit where a revision allows; a watch that asked
    /// for fragments gets a revision too large for one response in pieces.
    async fn send_events(&mut self, id: i64, events: &[Event], upto: i64) -> Result<(), Gone> {
        let Some(watch) = self.watches.get_mut(id) else {
            return Ok(());
        };
        if events.is_empty() {
            return Ok(());
        }
        watch.idle = false;
        let (with_prev, fragment) = (watch.prev_kv, watch.fragment);
        let limit = self.options.max_response_bytes;
        let mut start = 0;
        while start < events.len() {
            // Whole revisions up to the limit (at least one revision).
            let mut end = start;
            let mut bytes = 0;
            while end < events.len() {
                let rev = events[end].revision();
                let rev_end = events[end..]
                    .iter()
                    .position(|e| e.revision() != rev)
                    .map_or(events.len(), |p| end + p);
                let rev_bytes: usize = events[end..rev_end].iter().map(Event::bytes).sum();
                if end > start && bytes + rev_bytes > limit {
                    break;
                }
                bytes += rev_bytes;
                end = rev_end;
            }
            let header_rev = if end == events.len() {
                upto
            } else {
                events[end - 1].revision()
            };
            let chunk = &events[start..end];
            if fragment && bytes > limit {
                self.send_fragments(id, chunk, header_rev, with_prev)
                    .await?;
            } else {
                let mut resp = self.response(id, header_rev);
                resp.events = chunk.iter().map(|e| to_pb_event(e, with_prev)).collect();
                self.send(resp).await?;
            }
            metrics::counter!(WATCH_EVENTS_SENT.name).increment(chunk.len() as u64);
            start = end;
        }
        Ok(())
    }

    async fn send_fragments(
        &self,
        id: i64,
        events: &[Event],
        header_rev: i64,
        with_prev: bool,
    ) -> Result<(), Gone> {
        let limit = self.options.max_response_bytes;
        let mut pieces: Vec<Vec<PbEvent>> = vec![Vec::new()];
        let mut bytes = 0;
        for event in events {
            let piece_full = pieces.last().is_some_and(|p| !p.is_empty());
            if piece_full && bytes + event.bytes() > limit {
                pieces.push(Vec::new());
                bytes = 0;
            }
            bytes += event.bytes();
            if let Some(piece) = pieces.last_mut() {
                piece.push(to_pb_event(event, with_prev));
            }
        }
        let count = pieces.len();
        for (i, piece) in pieces.into_iter().enumerate() {
            let mut resp = self.response(id, header_rev);
            resp.events = piece;
            resp.fragment = i + 1 < count;
            self.send(resp).await?;
        }
        Ok(())
    }

    /// An empty response, carrying the revision it has been sent up to, to
    /// every watch that asked for progress and was sent nothing since the
    /// last tick.
    async fn progress(&mut self) -> Result<(), Gone> {
        let due: Vec<i64> = self
            .watches
            .iter()
            .filter(|(_, w)| w.progress_notify && w.idle)
            .map(|(id, _)| id)
            .collect();
        for watch in self.watches.values_mut() {
            watch.idle = true;
        }
        for id in due {
            self.send(self.response(id, self.seen)).await?;
        }
        Ok(())
    }
}

impl Drop for WatchStream {
    fn drop(&mut self) {
        metrics::gauge!(WATCHERS.name).decrement(self.watches.len() as f64);
        metrics::gauge!(WATCH_STREAMS.name).decrement(1.0);
    }
}

/// The first revision from `from` to `upto` at which the cell's ownership
/// record stopped owning `range` (it is written at that revision), with
/// the refusal it gives: nothing after it in history is the range's.
fn first_unowned(
    keys: &crate::mvcc::keyspace::KeySpace,
    range: &KeyRange,
    from: i64,
    upto: i64,
) -> Option<(i64, String)> {
    let record = KeyRange::single(latchkey_shared::directory::OWNERSHIP_KEY.to_vec());
    let mut records = History::new(keys, &record, from, upto, false);
    while !records.is_done() {
        for e in records.next_batch(usize::MAX) {
            if !matches!(e.kind, EventKind::Put) {
                continue;
            }
            let ownership = Ownership::decode(&e.kv.value).unwrap_or_else(|_| Ownership::nothing());
            if let Err(refused) = ownership.check_read(range) {
                return Some((e.revision(), refused.grpc_message().to_string()));
            }
        }
    }
    None
}

/// The ownership record `changes` writes, if it writes one (a delete owns
/// everything again, as a cell with no record does: `None` then too).
fn new_ownership(changes: &Changes) -> Option<Ownership> {
    let record = changes.events.iter().rev().find(|e| {
        e.kv.key == latchkey_shared::directory::OWNERSHIP_KEY && matches!(e.kind, EventKind::Put)
    })?;
    Some(Ownership::decode(&record.kv.value).unwrap_or_else(|_| Ownership::nothing()))
}
