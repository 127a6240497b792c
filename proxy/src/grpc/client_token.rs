//! A tower layer around every gRPC service: the call runs as the client
//! whose token its metadata carries (`token`, as etcd's clients send it,
//! or `authorization`), so the operations under the face carry it on what
//! they send the cell on the client's behalf (`ops::auth`).

use crate::ops::auth::{as_client, token_from_header};
use latchkey_shared::client::own_credentials::TOKEN_METADATA;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use tonic::codegen::http;

#[derive(Debug, Clone, Copy, Default)]
pub struct ClientTokenLayer;

impl<S> tower::Layer<S> for ClientTokenLayer {
    type Service = ClientToken<S>;

    fn layer(&self, inner: S) -> ClientToken<S> {
        ClientToken { inner }
    }
}

#[derive(Debug, Clone)]
pub struct ClientToken<S> {
    inner: S,
}

impl<S, B> tower::Service<http::Request<B>> for ClientToken<S>
where
    S: tower::Service<http::Request<B>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let headers = request.headers();
        let token = headers
            .get(TOKEN_METADATA)
            .or_else(|| headers.get(http::header::AUTHORIZATION))
            .and_then(|v| v.to_str().ok())
            .and_then(token_from_header);
        let answer = self.inner.call(request);
        Box::pin(as_client(token, answer))
    }
}
