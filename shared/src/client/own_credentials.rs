//! [`OwnCredentials`]: what a process presents to a cell for its own calls
//! (a proxy's refresh batches, shared watches and records): its auth
//! token, once the cell has authentication on, and the proxies' key
//! ([`proxy_key`](crate::auth::proxy_key)), with which a cell lets it
//! write latchkey's records while authentication is off. Whoever
//! authenticates sets the token; whoever opens a call attaches both. A
//! call made on a client's behalf carries the client's token instead,
//! never these.

use crate::auth::proxy_key::PROXY_KEY_METADATA;
use arc_swap::ArcSwapOption;
use std::sync::Arc;
use tonic::metadata::AsciiMetadataValue;

/// gRPC metadata that carries a token, as etcd's clients send it.
pub const TOKEN_METADATA: &str = "token";

#[derive(Clone, Default)]
pub struct OwnCredentials {
    token: Arc<ArcSwapOption<AsciiMetadataValue>>,
    proxy_key: Arc<ArcSwapOption<AsciiMetadataValue>>,
}

impl OwnCredentials {
    /// Presents `token` from now on (`None`: nothing). A token that is
    /// not valid metadata (never one a cell issued) is dropped.
    pub fn set(&self, token: Option<&str>) {
        self.token.store(metadata_value(token));
    }

    /// Presents `key` as the proxies' key from now on. A key file's key is
    /// always valid metadata (`proxy_key` checks it).
    pub fn set_proxy_key(&self, key: Option<&str>) {
        self.proxy_key.store(metadata_value(key));
    }

    pub fn is_set(&self) -> bool {
        self.token.load().is_some()
    }

    /// Puts the token and the key on `request`, each if there is one.
    pub fn attach<T>(&self, request: &mut tonic::Request<T>) {
        if let Some(token) = self.token.load_full() {
            request
                .metadata_mut()
                .insert(TOKEN_METADATA, (*token).clone());
        }
        if let Some(key) = self.proxy_key.load_full() {
            request
                .metadata_mut()
                .insert(PROXY_KEY_METADATA, (*key).clone());
        }
    }
}

fn metadata_value(s: Option<&str>) -> Option<Arc<AsciiMetadataValue>> {
    s.and_then(|t| AsciiMetadataValue::try_from(t).ok())
        .map(Arc::new)
}

/// Puts a client's `token` on `request` (nothing for `None`).
pub fn attach_client_token<T>(request: &mut tonic::Request<T>, token: Option<&str>) {
    if let Some(value) = token.and_then(|t| AsciiMetadataValue::try_from(t).ok()) {
        request.metadata_mut().insert(TOKEN_METADATA, value);
    }
}
