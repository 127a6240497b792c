//! [`AcceptedTokens`]: the client tokens the cell has accepted while its
//! authentication was on, with the user each names.
//!
//! The proxy holds no signing keys, so it cannot tell a token from a
//! forgery; the cell can. What the proxy does per user before it asks the
//! cell (a tenant's rate per user) uses only tokens the cell has already
//! accepted, so a forged token naming someone else never spends that
//! user's share. Every rise of the cell's auth version forgets them all (a
//! user deleted, a password changed, authentication turned off and on).

use dashmap::DashMap;
use latchkey_shared::auth::token::{claims_of_accepted, now_unix_ms};
use std::sync::Arc;

/// Tokens remembered at most (a token is a few hundred bytes); past it,
/// the expired ones go, then all.
const MAX_TOKENS: usize = 50_000;

struct Accepted {
    user: Arc<str>,
    expires_unix_ms: u64,
}

/// Sharded: every authenticated call through the proxy looks here, and no
/// one lock is shared by all of them.
#[derive(Default)]
pub struct AcceptedTokens {
    tokens: DashMap<Arc<str>, Accepted>,
}

impl AcceptedTokens {
    /// The cell has just accepted `token`.
    pub fn remember(&self, token: &str) {
        if self.tokens.contains_key(token) {
            return;
        }
        let Some(claims) = claims_of_accepted(token) else {
            return;
        };
        if self.tokens.len() >= MAX_TOKENS {
            let now = now_unix_ms();
            self.tokens.retain(|_, a| a.expires_unix_ms > now);
            if self.tokens.len() >= MAX_TOKENS {
                self.tokens.clear();
            }
        }
        self.tokens.insert(
            Arc::from(token),
            Accepted {
                user: Arc::from(claims.user),
                expires_unix_ms: claims.expires_unix_ms,
            },
        );
    }

    /// The user `token` names, if the cell has accepted it and it has not
    /// expired.
    pub fn user(&self, token: &str) -> Option<Arc<str>> {
        let accepted = self.tokens.get(token)?;
        (accepted.expires_unix_ms > now_unix_ms()).then(|| accepted.user.clone())
    }

    pub fn forget_all(&self) {
        self.tokens.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use latchkey_shared::auth::records::{TokenKey, UserRecord};
    use latchkey_shared::auth::token::sign;
    use std::time::Duration;

    #[test]
    fn only_a_remembered_unexpired_token_names_its_user() {
        let key = TokenKey {
            id: 1,
            secret: vec![7; 32],
        };
        let alice = UserRecord {
            name: "alice".into(),
            password_hash: None,
            roles: Default::default(),
        };
        let now = now_unix_ms();
        let good = sign(&key, &alice, now, Duration::from_secs(60));
        let old = sign(&key, &alice, now - 120_000, Duration::from_secs(60));
        let accepted = AcceptedTokens::default();
        assert_eq!(accepted.user(&good), None, "not accepted yet");
        accepted.remember(&good);
        accepted.remember(&old);
        accepted.remember("garbage");
        assert_eq!(accepted.user(&good).as_deref(), Some("alice"));
        assert_eq!(accepted.user(&old), None, "expired");
        assert_eq!(accepted.user("garbage"), None);
        accepted.forget_all();
        assert_eq!(accepted.user(&good), None);
    }
}
