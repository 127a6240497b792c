//! Who sends a request: the [`AuthView`] of this member's applied state
//! (decoded again only when the auth version changes) and the token a
//! request carries, as a [`Caller`] whose checks the faces apply before
//! any operation.
//!
//! While authentication is off, a request carrying one of the proxies'
//! keys (`--proxy-key-file`) is a [`Caller::Proxy`], which writes
//! latchkey's own records; any other is [`Caller::Anyone`].
//!
//! A member checks against what it has applied, as etcd's members do: a
//! change reaches a follower within its apply lag. Tokens need no cell
//! round trip: the signing keys are in the view.

use crate::state_machine::store::SharedState;
use arc_swap::ArcSwap;
use latchkey_shared::auth::proxy_key::{ProxyKeys, PROXY_KEY_METADATA};
use latchkey_shared::auth::records::{AUTH_PREFIX, VERSION_KEY};
use latchkey_shared::auth::token::now_unix_ms;
use latchkey_shared::auth::{AuthView, Caller};
use latchkey_shared::client::own_credentials::TOKEN_METADATA;
use latchkey_shared::{ApiError, KeyRange};
use std::sync::Arc;
use tonic::metadata::MetadataMap;

/// What newer etcd clients send besides `token`.
pub const AUTHORIZATION_METADATA: &str = "authorization";

pub struct AuthGate {
    state: SharedState,
    /// Read by every request without a lock; replaced when the auth
    /// version moves.
    cached: ArcSwap<AuthView>,
    proxy_keys: ProxyKeys,
}

impl AuthGate {
    pub fn new(state: SharedState, proxy_keys: ProxyKeys) -> AuthGate {
        AuthGate {
            state,
            cached: ArcSwap::from_pointee(AuthView::default()),
            proxy_keys,
        }
    }

    /// The auth records as this member has applied them. One key lookup
    /// when nothing changed; a scan of the auth records when it did.
    pub fn view(&self) -> Arc<AuthView> {
        let version = self
            .state
            .read(|s| s.keys.get(VERSION_KEY).map_or(0, |kv| kv.mod_revision));
        let cached = self.cached.load_full();
        if cached.version == version {
            return cached;
        }
        let (version, records) = self.state.read(|s| {
            let version = s.keys.get(VERSION_KEY).map_or(0, |kv| kv.mod_revision);
            let mut records = Vec::new();
            s.keys
                .scan(&KeyRange::prefix(AUTH_PREFIX), s.keys.revision(), |kv| {
                    records.push((kv.key.to_vec(), kv.value.to_vec()));
                    true
                });
            (version, records)
        });
        let view = Arc::new(AuthView::from_records(
            version,
            records.iter().map(|(k, v)| (k.as_slice(), v.as_slice())),
        ));
        self.cached.store(view.clone());
        view
    }

    /// Who sent a gRPC request with this metadata.
    pub fn caller(&self, metadata: &MetadataMap) -> Result<Caller, ApiError> {
        let token = metadata
            .get(TOKEN_METADATA)
            .or_else(|| metadata.get(AUTHORIZATION_METADATA))
            .and_then(|v| v.to_str().ok());
        match self.view().caller(token, now_unix_ms())? {
            Caller::Anyone if self.presents_proxy_key(metadata) => Ok(Caller::Proxy),
            caller => Ok(caller),
        }
    }

    fn presents_proxy_key(&self, metadata: &MetadataMap) -> bool {
        let presented = metadata
            .get(PROXY_KEY_METADATA)
            .and_then(|v| v.to_str().ok());
        self.proxy_keys.admits(presented)
    }

    /// The caller again, against the records as they are now: a stream
    /// checks its caller this way so that a revoked permission or a
    /// deleted user ends what it allowed.
    pub fn recheck(&self, caller: &Caller) -> Result<Caller, ApiError> {
        match caller {
            // Authentication turned on under a stream opened without it.
            Caller::Anyone | Caller::Proxy => match self.view().caller(None, now_unix_ms())? {
                Caller::Anyone => Ok(caller.clone()),
                other => Ok(other),
            },
            Caller::User { name, .. } => {
                let view = self.view();
                if !view.enabled {
                    return Ok(Caller::Anyone);
                }
                if !view.users.contains_key(name) {
                    return Err(ApiError::invalid_auth_token(
                        "invalid auth token: the user is gone",
                    ));
                }
                Ok(Caller::User {
                    view,
                    name: name.clone(),
                })
            }
        }
    }
}
