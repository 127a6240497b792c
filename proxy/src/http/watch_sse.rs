//! `GET /v1/watch/{key}`: changes to a key or prefix as Server-Sent
//! Events, through the coalescer: every client watching the same range
//! (with the same `prev_kv`) shares ONE upstream watch per proxy, and gets
//! each revision at its own offset inside `--fanout-jitter`.
//!
//! The last event of each revision has the revision as its `id`, so a
//! client that reconnects with `Last-Event-ID` resumes right after the
//! last whole revision it saw. The stream ends with one `error` event
//! when the watch cannot go on: a start revision compacted away
//! (`compacted`, naming the compact revision), a client too slow to keep
//! up with its bounded buffer (`watch_too_slow`, naming the revision to
//! resume from), or an upstream watch that ended.

use super::extract::{on, Flag, Path, Query};
use super::model::{ErrorBody, KeyValue};
use crate::http::kv::key_range;
use crate::metrics_catalog::SLOW_CLIENTS_CANCELLED;
use crate::state::ProxyState;
use crate::watch::client_watches::Held;
use crate::watch::fanout::Paced;
use crate::watch::read_permits::ReadPermit;
use crate::watch::{Cancel, Item, WatchKey};
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::Stream;
use futures::StreamExt;
use latchkey_shared::etcd_enums::EventType;
use latchkey_shared::etcdpb::PbEvent;
use latchkey_shared::{ApiError, ErrorCode};
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::Duration;
use utoipa::{IntoParams, ToSchema};

/// A comment line this often keeps idle connections (and the proxies in
/// between) from timing the stream out.
pub const SSE_KEEP_ALIVE: Duration = Duration::from_secs(15);

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct WatchParams {
    /// Watch every key that starts with the path's key.
    #[param(value_type = Option<bool>)]
    pub prefix: Option<Flag>,
    /// Send every change from this revision on, then live ones (absent:
    /// live changes only).
    pub from_revision: Option<i64>,
    /// Each event also carries the key as it was before the change.
    #[param(value_type = Option<bool>)]
    pub prev_kv: Option<Flag>,
}

/// One `put` or `delete` event (the SSE `event` field says which).
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct WatchEvent {
    /// `put` or `delete`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The revision of the change.
    pub revision: i64,
    pub kv: KeyValue,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prev_kv: Option<KeyValue>,
}

pub fn event_of(kind: &str, id: Option<i64>, json: serde_json::Value) -> Event {
    // Fields go out in the order they are set: event, id, data.
    let event = Event::default().event(kind);
    let event = match id {
        Some(id) => event.id(id.to_string()),
        None => event,
    };
    event.data(json.to_string())
}

pub fn error_event(e: &ApiError) -> Event {
    Event::default()
        .event("error")
        .data(e.json_body().to_string())
}

/// Watch a key or prefix.
#[utoipa::path(get, path = "/v1/watch/{*key}", tag = "watch",
    params(("key" = String, Path, description = "The key (the rest of the path)"), WatchParams,
        ("Last-Event-ID" = Option<i64>, Header, description = "Resume after this revision (what the last event's id was)")),
    responses((status = 200, content_type = "text/event-stream", body = WatchEvent,
        description = "Events `put` and `delete` (data: WatchEvent), `error` (data: the error body, e.g. compacted with compact_revision)"),
        (status = "4XX", body = ErrorBody), (status = "5XX", body = ErrorBody)))]
pub async fn watch(
    State(state): State<Arc<ProxyState>>,
    Path(key): Path<String>,
    Query(params): Query<WatchParams>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let range = key_range(key.as_bytes(), on(params.prefix))?;
    let start_revision = start_revision(&headers, params.from_revision)?;
    let with_prev = on(params.prev_kv);
    // The shared watch reads as the proxy: the cell first says this client
    // may read the range, and again whenever its auth records change.
    let permit = crate::ops::auth::read_permit(&state, &range).await?;
    let watch_key = WatchKey::new(range.start, range.end, &[], with_prev)?;
    serve(&state, watch_key, start_revision, permit).await
}

/// Where a watch starts: right after `Last-Event-ID` when the client
/// resumes, else `from_revision`, else the next revision (0).
pub fn start_revision(headers: &HeaderMap, from_revision: Option<i64>) -> Result<i64, ApiError> {
    let resume = match headers.get("last-event-id") {
        None => None,
        Some(v) => Some(
            v.to_str()
                .ok()
                .and_then(|s| s.trim().parse::<i64>().ok())
                .filter(|r| *r >= 0)
                .ok_or_else(|| ApiError::invalid("Last-Event-ID must be a revision"))?,
        ),
    };
    let start = match (resume, from_revision) {
        (Some(last), _) => last
            .checked_add(1)
            .ok_or_else(|| ApiError::invalid("Last-Event-ID is past the last revision"))?,
        (None, Some(r)) if r < 0 => {
            return Err(ApiError::invalid(format!(
                "from_revision must be 0 or more, not {r}"
            )))
        }
        (None, Some(r)) => r,
        (None, None) => 0,
    };
    Ok(start)
}

/// The SSE stream of the coalesced watch `watch_key` from `start_revision`,
/// for a client whose `permit` allows it; it ends when the permit is
/// revoked.
pub async fn serve(
    state: &Arc<ProxyState>,
    watch_key: WatchKey,
    start_revision: i64,
    permit: ReadPermit,
) -> Result<Response, ApiError> {
    let with_prev = watch_key.prev_kv;
    let held = state.client_watches.take("sse")?;
    let coalescer = state
        .coalescers
        .for_range(&state.upstream, &watch_key.range)?;
    let subscription = match coalescer.subscribe(watch_key, start_revision).await {
        Ok(subscription) => subscription,
        // The stream opens and says why it ends, as it would for a
        // compaction met later.
        Err(e) if e.code == ErrorCode::Compacted => {
            let only = futures::stream::iter([Ok::<_, std::convert::Infallible>(error_event(&e))]);
            return Ok(Sse::new(only).into_response());
        }
        Err(e) => return Err(e),
    };
    let from = subscription.from;
    let paced = Paced::new(subscription, state.fanout.next_pace()).stands_on(permit);
    let events = sse_events(paced, from - 1, with_prev, held);
    Ok(Sse::new(events)
        .keep_alive(KeepAlive::new().interval(SSE_KEEP_ALIVE))
        .into_response())
}

/// What is left of one client's SSE stream.
struct Feed {
    items: Paced,
    /// The last revision sent.
    sent_through: i64,
    with_prev: bool,
    ended: bool,
    /// The client watch's place, while the stream lives.
    _held: Held,
}

/// The SSE events of a client watch's items; an error event ends it.
fn sse_events(
    items: Paced,
    sent_through: i64,
    with_prev: bool,
    held: Held,
) -> impl Stream<Item = Result<Event, std::convert::Infallible>> {
    let feed = Feed {
        items,
        sent_through,
        with_prev,
        ended: false,
        _held: held,
    };
    futures::stream::unfold(feed, |mut feed| async move {
        if feed.ended {
            return None;
        }
        loop {
            let events = match feed.items.next().await {
                Some(Item::Events(revision)) => {
                    feed.sent_through = revision.revision;
                    events_of(&revision.events, feed.with_prev)
                }
                Some(Item::Progress(_)) => continue,
                Some(Item::Cancelled(Cancel::Compacted { compact_revision })) => {
                    feed.ended = true;
                    vec![error_event(&ApiError::compacted(compact_revision))]
                }
                Some(Item::Cancelled(Cancel::Ended { reason })) => {
                    feed.ended = true;
                    vec![error_event(&ApiError::unavailable(format!(
                        "the watch was canceled: {reason}; watch again from revision {}",
                        feed.sent_through + 1
                    )))]
                }
                Some(Item::Cancelled(Cancel::Revoked(refused))) => {
                    feed.ended = true;
                    vec![error_event(&refused)]
                }
                // Closed without a cancel: dropped for reading too slowly.
                None => {
                    feed.ended = true;
                    metrics::counter!(SLOW_CLIENTS_CANCELLED.name).increment(1);
                    vec![error_event(&ApiError::watch_too_slow(
                        feed.sent_through + 1,
                    ))]
                }
            };
            let batch = futures::stream::iter(events.into_iter().map(Ok));
            return Some((batch, feed));
        }
    })
    .flatten()
}

/// The events of one watch response. Only the last event of a revision
/// carries the SSE `id`, so a client that resumes with `Last-Event-ID`
/// after a break never skips the rest of a revision it saw part of.
fn events_of(events: &[PbEvent], with_prev: bool) -> Vec<Event> {
    let revisions: Vec<i64> = events
        .iter()
        .map(|e| e.kv.as_ref().map_or(0, |kv| kv.mod_revision))
        .collect();
    events
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let last_of_revision = revisions.get(i + 1) != revisions.get(i);
            let kind = match EventType::try_from(e.r#type) {
                Ok(EventType::Delete) => "delete",
                _ => "put",
            };
            let kv = e.kv.clone().unwrap_or_default();
            let revision = kv.mod_revision;
            let body = WatchEvent {
                kind: kind.to_string(),
                revision,
                kv: KeyValue::from_pb(&kv, false),
                prev_kv: if with_prev {
                    e.prev_kv.as_ref().map(|p| KeyValue::from_pb(p, false))
                } else {
                    None
                },
            };
            event_of(
                kind,
                last_of_revision.then_some(revision),
                serde_json::to_value(body).unwrap_or_default(),
            )
        })
        .collect()
}
