//! Charging a client's request to the tenant that owns the key it names
//! ([`TenantLimits`](crate::tenant_limits::TenantLimits)), before the proxy
//! acts on it: KV operations, watches, locks and elections.

use super::auth::{client_token, op_key};
use crate::state::ProxyState;
use latchkey_shared::etcdpb::PbTxnRequest;
use latchkey_shared::ApiError;
use tokio::time::Instant;

/// Charges this task's client for one request naming `key`: refused with
/// `rate_limited` past its tenant's rate, or its rate per user.
pub fn charge(state: &ProxyState, key: &[u8]) -> Result<(), ApiError> {
    let user = || {
        let token = client_token()?;
        state.upstream.cell_for(key).accepted_tokens.user(&token)
    };
    state.tenant_limits.charge(key, user, Instant::now())
}

/// The key a txn is charged for: its first compare's, else its first
/// operation's.
pub fn txn_key(txn: &PbTxnRequest) -> Vec<u8> {
    txn.compare
        .first()
        .map(|c| c.key.clone())
        .or_else(|| txn.success.iter().chain(&txn.failure).find_map(op_key))
        .unwrap_or_default()
}
