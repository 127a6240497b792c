//! The proxy's HTTP API with hostile requests: any method, path, query,
//! headers and body, through the router, its extractors and handlers to a
//! live one-member cell. Fails on a panic anywhere in the process, or on a
//! 500: a bad request must get a 4xx that says what is wrong, and only a
//! fault of ours may answer 500.
//!
//! Input: a method byte, then the request target up to `\n`, then header
//! lines (`name: value`) up to an empty line, then the body.

#![no_main]

use axum::body::Body;
use axum::http::{HeaderName, HeaderValue, Method, Request, StatusCode, Uri};
use latchkey_fuzz::live::Live;
use latchkey_fuzz::Input;
use libfuzzer_sys::fuzz_target;
use std::time::Duration;
use tower::ServiceExt;

const METHODS: [Method; 6] = [
    Method::GET,
    Method::PUT,
    Method::POST,
    Method::DELETE,
    Method::PATCH,
    Method::HEAD,
];

/// Longer than any wait the API allows a request (a lock or campaign
/// waits at most the request timeout): a request still unanswered after it
/// hangs, which the fuzzer reports as a timeout.
const ANSWER_WITHIN: Duration = Duration::from_secs(30);

fuzz_target!(|data: &[u8]| {
    let mut input = Input::new(data);
    let method = METHODS[input.byte() as usize % METHODS.len()].clone();
    let Ok(uri) = Uri::try_from(input.line()) else {
        return;
    };
    let mut request = Request::builder().method(method).uri(uri);
    loop {
        let line = input.line();
        if line.is_empty() {
            break;
        }
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            continue;
        };
        let (name, value) = (&line[..colon], line[colon + 1..].trim_ascii());
        if let (Ok(name), Ok(value)) =
            (HeaderName::from_bytes(name), HeaderValue::from_bytes(value))
        {
            request = request.header(name, value);
        }
    }
    let Ok(request) = request.body(Body::from(input.rest().to_vec())) else {
        return;
    };
    let live = Live::get();
    live.runtime.block_on(async {
        let response = tokio::time::timeout(ANSWER_WITHIN, live.http.clone().oneshot(request))
            .await
            .expect("the HTTP API did not answer within 30 s");
        let Ok(response) = response;
        let status = response.status();
        // A streamed answer (a watch's events) is read for a moment only.
        let body = tokio::time::timeout(
            Duration::from_millis(20),
            axum::body::to_bytes(response.into_body(), 1 << 20),
        )
        .await;
        assert_ne!(
            status,
            StatusCode::INTERNAL_SERVER_ERROR,
            "a 500 for a client's request: {body:?}"
        );
    });
});
