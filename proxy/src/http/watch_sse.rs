//! `GET /v1/watch/{key}`: changes to a key or prefix as Server-Sent
//! Events. The last event of each revision has the revision as its `id`,
//! so a client that reconnects with `Last-Event-ID` resumes right after
//! the last whole revision it saw; a start
//! revision that was compacted away gets one `error` event naming the
//! compact revision, and the stream ends.

use super::extract::{on, Flag, Path, Query};
use super::model::{ErrorBody, KeyValue};
use crate::grpc::watch::WATCH;
use crate::http::kv::key_range;
use crate::state::ProxyState;
use crate::upstream::Route;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use futures::Stream;
use futures::StreamExt;
use latchkey_shared::client::call;
use latchkey_shared::etcd_enums::EventType;
use latchkey_shared::etcdpb::{PbWatchRequest, PbWatchRequestUnion, PbWatchResponse};
use latchkey_shared::{classify_call_failure, ApiError};
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::Duration;
use utoipa::{IntoParams, ToSchema};

/// A comment line this often keeps idle connections (and the proxies in
/// between) from timing the stream out.
const SSE_KEEP_ALIVE: Duration = Duration::from_secs(15);

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

fn event_of(kind: &str, id: Option<i64>, json: serde_json::Value) -> Event {
    // Fields go out in the order they are set: event, id, data.
    let event = Event::default().event(kind);
    let event = match id {
        Some(id) => event.id(id.to_string()),
        None => event,
    };
    event.data(json.to_string())
}

fn error_event(e: &ApiError) -> Event {
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
) -> Result<Sse<impl Stream<Item = Result<Event, std::convert::Infallible>>>, ApiError> {
    let range = key_range(key.as_bytes(), on(params.prefix))?;
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
    let start_revision = match (resume, params.from_revision) {
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
    let with_prev = on(params.prev_kv);
    let mut create = PbWatchRequest {
        request_union: Some(PbWatchRequestUnion::CreateRequest(Default::default())),
    };
    if let Some(PbWatchRequestUnion::CreateRequest(c)) = &mut create.request_union {
        c.key = range.start;
        c.range_end = range.end;
        c.start_revision = start_revision;
        c.prev_kv = with_prev;
    }
    let cell = state.upstream.cell_for(key.as_bytes()).clone();
    let member = cell.pick(Route::Any, 0);
    let channel = cell.members[member].channel.clone();
    // The upstream request stream stays open exactly as long as the
    // client's SSE stream: when that is dropped (the client went away),
    // `stop` is dropped with it, the request stream ends, and the member
    // ends the watch. (Dropping the answers alone does not: the HTTP/2
    // request body lives on in the transport.)
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let requests = futures::stream::iter([create])
        .chain(futures::stream::once(stopped).filter_map(|_| futures::future::ready(None)));
    let mut answers =
        call::streaming::<PbWatchRequest, PbWatchResponse, _>(channel, WATCH, requests).await?;
    // The first answer says whether the watch was created.
    let first = tokio::time::timeout(state.request_timeout, answers.next())
        .await
        .map_err(|_| ApiError::unavailable("the member did not create the watch in time"))?;
    let created = match first {
        Some(Ok(resp)) => resp,
        Some(Err(status)) => return Err(classify_call_failure(&status)),
        None => return Err(ApiError::unavailable("the member ended the watch at once")),
    };
    metrics::gauge!("latchkey_proxy_sse_watches").increment(1.0);
    let guard = SseGauge { _stop: stop };
    let events = async_stream(answers, with_prev, created, guard);
    Ok(Sse::new(events).keep_alive(KeepAlive::new().interval(SSE_KEEP_ALIVE)))
}

/// The error a watch response reports (compacted, canceled), if any.
fn watch_failure(resp: &PbWatchResponse) -> Option<ApiError> {
    if resp.compact_revision > 0 {
        return Some(ApiError::compacted(resp.compact_revision));
    }
    if resp.canceled {
        return Some(ApiError::unavailable(format!(
            "the watch was canceled: {}",
            resp.cancel_reason
        )));
    }
    None
}

/// Lives as long as the client's SSE stream: decrements the gauge and ends
/// the upstream watch when dropped.
struct SseGauge {
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl Drop for SseGauge {
    fn drop(&mut self) {
        metrics::gauge!("latchkey_proxy_sse_watches").decrement(1.0);
    }
}

/// The SSE events of a watch's responses; an error event ends it.
fn async_stream(
    answers: tonic::Streaming<PbWatchResponse>,
    with_prev: bool,
    created: PbWatchResponse,
    guard: SseGauge,
) -> impl Stream<Item = Result<Event, std::convert::Infallible>> {
    let rest = futures::stream::iter([Ok(created)])
        .chain(answers)
        .map(move |answer| match answer {
            Ok(resp) => match watch_failure(&resp) {
                Some(e) => vec![Err(error_event(&e))],
                None => events_of(resp, with_prev),
            },
            Err(status) => vec![Err(error_event(&classify_call_failure(&status)))],
        })
        .flat_map(futures::stream::iter);
    let mut ended = false;
    rest.take_while(move |item| {
        // Let the error event through, then stop.
        let go = !ended;
        ended |= item.is_err();
        futures::future::ready(go)
    })
    .map(move |item| {
        let _ = &guard;
        Ok(item.unwrap_or_else(|e| e))
    })
}

/// The events of one watch response. Only the last event of a revision
/// carries the SSE `id`, so a client that resumes with `Last-Event-ID`
/// after a break never skips the rest of a revision it saw part of.
fn events_of(resp: PbWatchResponse, with_prev: bool) -> Vec<Result<Event, Event>> {
    let revisions: Vec<i64> = resp
        .events
        .iter()
        .map(|e| e.kv.as_ref().map_or(0, |kv| kv.mod_revision))
        .collect();
    resp.events
        .into_iter()
        .enumerate()
        .map(|(i, e)| {
            let last_of_revision = revisions.get(i + 1) != revisions.get(i);
            let kind = match EventType::try_from(e.r#type) {
                Ok(EventType::Delete) => "delete",
                _ => "put",
            };
            let kv = e.kv.unwrap_or_default();
            let revision = kv.mod_revision;
            let body = WatchEvent {
                kind: kind.to_string(),
                revision,
                kv: KeyValue::from_pb(&kv, false),
                prev_kv: if with_prev {
                    e.prev_kv.map(|p| KeyValue::from_pb(&p, false))
                } else {
                    None
                },
            };
            Ok(event_of(
                kind,
                last_of_revision.then_some(revision),
                serde_json::to_value(body).unwrap_or_default(),
            ))
        })
        .collect()
}
