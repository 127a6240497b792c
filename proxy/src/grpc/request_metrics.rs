//! The gRPC face's request metrics, in one place: a tower layer around
//! every service times each unary call and counts it by method path and
//! outcome, so the handlers do not.
//!
//! The outcome is read from the response's headers: a failed call is a
//! trailers-only response whose headers carry `grpc-status` and, for
//! latchkey's own errors, the `latchkey-error` code name; a call without
//! them succeeded. Only the method paths in [`etcd_methods::UNARY`] are
//! labels (a client can send any path; an unknown one is counted as
//! `unknown`, so no client can grow the label set). Streams are not timed
//! here, since a stream's response headers come when it opens: a
//! keep-alive stream counts each keep-alive it answers with
//! [`record_keep_alive`].

use crate::metrics_catalog::{REQUESTS, REQUEST_SECONDS};
use latchkey_shared::error::metadata_keys as metadata;
use latchkey_shared::{etcd_methods, ApiError, ErrorCode};
use std::borrow::Cow;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::time::Instant;
use tonic::codegen::http;

/// Times and counts unary calls: `Server::builder().layer(RequestMetricsLayer)`.
#[derive(Debug, Clone, Copy, Default)]
pub struct RequestMetricsLayer;

impl<S> tower::Layer<S> for RequestMetricsLayer {
    type Service = RequestMetrics<S>;

    fn layer(&self, inner: S) -> RequestMetrics<S> {
        RequestMetrics { inner }
    }
}

/// The service [`RequestMetricsLayer`] wraps around the gRPC services.
#[derive(Debug, Clone)]
pub struct RequestMetrics<S> {
    inner: S,
}

impl<S, B, RB> tower::Service<http::Request<B>> for RequestMetrics<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<RB>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let route = unary_route(request.uri().path());
        let started = Instant::now();
        let answer = self.inner.call(request);
        Box::pin(async move {
            let response = answer.await?;
            if let Some(route) = route {
                record(route, started, outcome(response.headers()));
            }
            Ok(response)
        })
    }
}

/// The label of a unary method's path; `None` for a stream; `unknown`
/// for a path latchkey does not serve.
fn unary_route(path: &str) -> Option<&'static str> {
    if etcd_methods::STREAMING.contains(&path) {
        return None;
    }
    let known = etcd_methods::UNARY.iter().find(|p| **p == path);
    Some(known.copied().unwrap_or("unknown"))
}

/// `ok`, latchkey's error code name, or `grpc_<code>` for a status that
/// did not come from a latchkey error (a message too large to decode).
fn outcome(headers: &http::HeaderMap) -> Cow<'static, str> {
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if let Some(code) = text(metadata::ERROR).and_then(ErrorCode::from_name) {
        return Cow::Borrowed(code.as_str());
    }
    match text("grpc-status").map(|s| tonic::Code::from_bytes(s.as_bytes())) {
        None | Some(tonic::Code::Ok) => Cow::Borrowed("ok"),
        Some(code) => Cow::Owned(format!("grpc_{code:?}")),
    }
}

fn record(route: &'static str, started: Instant, outcome: Cow<'static, str>) {
    metrics::histogram!(REQUEST_SECONDS.name, "api" => "grpc", "route" => route)
        .record(started.elapsed().as_secs_f64());
    metrics::counter!(REQUESTS.name, "api" => "grpc", "route" => route, "outcome" => outcome)
        .increment(1);
}

/// One keep-alive of a stream answered (or failed) since `started`,
/// counted like a unary call under the keep-alive method's path.
pub fn record_keep_alive(started: Instant, error: Option<&ApiError>) {
    let outcome = error.map_or("ok", |e| e.code.as_str());
    record(
        etcd_methods::lease::KEEP_ALIVE,
        started,
        Cow::Borrowed(outcome),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_served_unary_paths_are_labels_and_streams_are_left_alone() {
        assert_eq!(
            unary_route(etcd_methods::kv::RANGE),
            Some(etcd_methods::kv::RANGE)
        );
        assert_eq!(
            unary_route(etcd_methods::lock::LOCK),
            Some(etcd_methods::lock::LOCK)
        );
        assert_eq!(
            unary_route("/evil/a-new-label-per-request"),
            Some("unknown")
        );
        assert_eq!(unary_route(etcd_methods::watch::WATCH), None);
        assert_eq!(unary_route(etcd_methods::lease::KEEP_ALIVE), None);
    }

    #[test]
    fn the_outcome_is_the_error_code_then_the_grpc_status_then_ok() {
        let mut h = http::HeaderMap::new();
        assert_eq!(outcome(&h), "ok");
        h.insert("grpc-status", http::HeaderValue::from_static("0"));
        assert_eq!(outcome(&h), "ok");
        h.insert("grpc-status", http::HeaderValue::from_static("8"));
        assert_eq!(outcome(&h), "grpc_ResourceExhausted");
        let name = ErrorCode::LeaseNotFound.as_str();
        h.insert(metadata::ERROR, http::HeaderValue::from_static(name));
        assert_eq!(outcome(&h), name);
    }
}
