//! [`OwnToken`]: the auth token a process presents to a cell for its own
//! calls (a proxy's refresh batches, shared watches and records, once the
//! cell has authentication on). Whoever authenticates sets it; whoever
//! opens a call attaches it. A call made on a client's behalf carries the
//! client's token instead, never this one.

use arc_swap::ArcSwapOption;
use std::sync::Arc;
use tonic::metadata::AsciiMetadataValue;

/// gRPC metadata that carries a token, as etcd's clients send it.
pub const TOKEN_METADATA: &str = "token";

#[derive(Clone, Default)]
pub struct OwnToken(Arc<ArcSwapOption<AsciiMetadataValue>>);

impl OwnToken {
    /// Presents `token` from now on (`None`: nothing). A token that is
    /// not valid metadata (never one a cell issued) is dropped.
    pub fn set(&self, token: Option<&str>) {
        let value = token.and_then(|t| AsciiMetadataValue::try_from(t).ok());
        self.0.store(value.map(Arc::new));
    }

    pub fn is_set(&self) -> bool {
        self.0.load().is_some()
    }

    /// Puts the token on `request`, unless it has none.
    pub fn attach<T>(&self, request: &mut tonic::Request<T>) {
        if let Some(token) = self.0.load_full() {
            request
                .metadata_mut()
                .insert(TOKEN_METADATA, (*token).clone());
        }
    }
}

/// Puts a client's `token` on `request` (nothing for `None`).
pub fn attach_client_token<T>(request: &mut tonic::Request<T>, token: Option<&str>) {
    if let Some(value) = token.and_then(|t| AsciiMetadataValue::try_from(t).ok()) {
        request.metadata_mut().insert(TOKEN_METADATA, value);
    }
}
