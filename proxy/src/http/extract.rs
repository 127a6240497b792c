//! Request extractors whose rejections are [`ApiError`]s, so a malformed
//! query, JSON body or oversized body gets the API's JSON error with the
//! table's status instead of axum's plain-text one.

use crate::ops::idempotency::Keyed;
use axum::extract::rejection::{BytesRejection, PathRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use latchkey_shared::ApiError;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer};

/// A query string; a missing, non-numeric or unknown parameter is
/// `invalid_argument`.
pub struct Query<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for Query<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        axum::extract::Query::<T>::from_request_parts(parts, state)
            .await
            .map(|q| Query(q.0))
            .map_err(|e: QueryRejection| {
                ApiError::invalid(format!("bad query string: {}", e.body_text()))
            })
    }
}

/// The client's address (its connection's peer), when the server knows
/// it: what keeps one client's serializable reads from going backwards.
pub struct Client(pub Option<std::net::SocketAddr>);

impl<S: Send + Sync> FromRequestParts<S> for Client {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        Ok(Client(
            parts
                .extensions
                .get::<axum::extract::ConnectInfo<latchkey_shared::tls::RemotePeer>>()
                .map(|c| c.0.addr),
        ))
    }
}

/// A path parameter (percent-decoded).
pub struct Path<T>(pub T);

impl<T: DeserializeOwned + Send, S: Send + Sync> FromRequestParts<S> for Path<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        axum::extract::Path::<T>::from_request_parts(parts, state)
            .await
            .map(|p| Path(p.0))
            .map_err(|e: PathRejection| ApiError::invalid(format!("bad path: {}", e.body_text())))
    }
}

/// A JSON body, whatever its Content-Type says (curl sends form
/// encoding by default); malformed JSON or a wrong field is
/// `invalid_argument`, a body over the limit `request_too_large`.
pub struct Json<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for Json<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let Body(bytes) = Body::from_request(req, state).await?;
        serde_json::from_slice(&bytes)
            .map(Json)
            .map_err(|e| ApiError::invalid(format!("bad JSON body: {e}")))
    }
}

/// The header that makes a write retry-safe.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// A JSON body (as [`Json`]) and the request's `Idempotency-Key`, if it
/// names one, with what identifies the request.
pub struct KeyedJson<T>(pub T, pub Option<Keyed>);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for KeyedJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let KeyedBody(bytes, keyed) = KeyedBody::from_request(req, state).await?;
        serde_json::from_slice(&bytes)
            .map(|body| KeyedJson(body, keyed))
            .map_err(|e| ApiError::invalid(format!("bad JSON body: {e}")))
    }
}

/// A raw body (as [`Body`]) and the request's `Idempotency-Key`, if it
/// names one, with what identifies the request: its method, path and
/// query, and body.
pub struct KeyedBody(pub axum::body::Bytes, pub Option<Keyed>);

impl<S: Send + Sync> FromRequest<S> for KeyedBody {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let key = match req.headers().get(IDEMPOTENCY_KEY) {
            None => None,
            Some(value) => Some(
                value
                    .to_str()
                    .map_err(|_| {
                        ApiError::invalid("an Idempotency-Key is visible ASCII characters only")
                    })?
                    .to_owned(),
            ),
        };
        let method = req.method().as_str().as_bytes().to_vec();
        let target = req
            .uri()
            .path_and_query()
            .map_or_else(Vec::new, |p| p.as_str().as_bytes().to_vec());
        let Body(bytes) = Body::from_request(req, state).await?;
        let keyed = key.map(|key| Keyed {
            key,
            request: vec![method, target, bytes.to_vec()],
        });
        Ok(KeyedBody(bytes, keyed))
    }
}

/// A raw body; over the limit it is `request_too_large`.
pub struct Body(pub axum::body::Bytes);

impl<S: Send + Sync> FromRequest<S> for Body {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        axum::body::Bytes::from_request(req, state)
            .await
            .map(Body)
            .map_err(bytes_rejection)
    }
}

fn bytes_rejection(e: BytesRejection) -> ApiError {
    if e.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
        ApiError::request_too_large()
            .with_message(format!("the body is too large: {}", e.body_text()))
    } else {
        ApiError::invalid(format!("the body could not be read: {}", e.body_text()))
    }
}

/// A query flag: present without a value (`?prefix`), or `true`/`false`,
/// `1`/`0`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Flag(pub bool);

impl<'de> Deserialize<'de> for Flag {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        match text.as_str() {
            "" | "true" | "1" => Ok(Flag(true)),
            "false" | "0" => Ok(Flag(false)),
            other => Err(serde::de::Error::custom(format!(
                "{other:?} is not a flag value (true, false, 1, 0, or nothing)"
            ))),
        }
    }
}

/// Whether an optional flag is set.
pub fn on(flag: Option<Flag>) -> bool {
    flag.is_some_and(|f| f.0)
}
