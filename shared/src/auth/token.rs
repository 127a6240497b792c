//! Signed tokens: what `Authenticate` returns and every later request
//! carries (gRPC metadata `token`, as etcd's clients send it; HTTP
//! `Authorization: Bearer`).
//!
//! A token is `<payload>.<mac>`, both base64url without padding. The
//! payload is JSON `{"u": user, "k": key id, "e": expiry in unix ms, "p":
//! the user's password fingerprint}` (so a password change ends every
//! token issued under the old one);
//! the mac is HMAC-SHA256 of the payload's bytes under the secret of key
//! `k`, compared in constant time. The secrets are auth records (so every
//! member holds them and nobody else reads them): turning authentication
//! on adds a fresh random 256-bit key, which signs from then on; the two
//! newest keys verify, so tokens signed just before a rotation stay good
//! until they expire. A token lives [`TOKEN_TTL`]; etcd's clients
//! authenticate again when a request answers "invalid auth token".

use super::records::{TokenKey, UserRecord};
use crate::ApiError;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use ring::hmac;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// How long a token is good for (etcd's JWT tokens default to 5 minutes).
pub const TOKEN_TTL: Duration = Duration::from_secs(300);

/// How many keys verify: the signing one and the one before it.
pub const KEYS_KEPT: usize = 2;

/// What a token says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claims {
    #[serde(rename = "u")]
    pub user: String,
    #[serde(rename = "k")]
    pub key_id: u64,
    #[serde(rename = "e")]
    pub expires_unix_ms: u64,
    /// [`UserRecord::fingerprint`](super::records::UserRecord::fingerprint)
    /// when the token was issued.
    #[serde(rename = "p")]
    pub password: String,
}

fn mac_key(key: &TokenKey) -> hmac::Key {
    hmac::Key::new(hmac::HMAC_SHA256, &key.secret)
}

/// A token for `user`, signed with `key`, good until `now + ttl`.
pub fn sign(key: &TokenKey, user: &UserRecord, now_unix_ms: u64, ttl: Duration) -> String {
    let claims = Claims {
        user: user.name.clone(),
        password: user.fingerprint(),
        key_id: key.id,
        expires_unix_ms: now_unix_ms.saturating_add(ttl.as_millis() as u64),
    };
    // Serialising a struct of a string and two integers cannot fail.
    let payload = serde_json::to_vec(&claims).unwrap_or_default();
    let tag = hmac::sign(&mac_key(key), &payload);
    format!(
        "{}.{}",
        URL_SAFE_NO_PAD.encode(&payload),
        URL_SAFE_NO_PAD.encode(tag.as_ref())
    )
}

/// The claims of `token` if one of `keys` signed it and it has not
/// expired at `now`.
pub fn verify(keys: &[TokenKey], token: &str, now_unix_ms: u64) -> Result<Claims, ApiError> {
    let bad = |why: &str| ApiError::invalid_auth_token(format!("invalid auth token: {why}"));
    let (payload, tag) = token
        .split_once('.')
        .ok_or_else(|| bad("not a latchkey token"))?;
    let payload = URL_SAFE_NO_PAD
        .decode(payload)
        .map_err(|_| bad("not a latchkey token"))?;
    let tag = URL_SAFE_NO_PAD
        .decode(tag)
        .map_err(|_| bad("not a latchkey token"))?;
    let claims: Claims =
        serde_json::from_slice(&payload).map_err(|_| bad("not a latchkey token"))?;
    let key = keys
        .iter()
        .find(|k| k.id == claims.key_id)
        .ok_or_else(|| bad("signed with a key this cell no longer has"))?;
    hmac::verify(&mac_key(key), &payload, &tag).map_err(|_| bad("bad signature"))?;
    if claims.expires_unix_ms <= now_unix_ms {
        return Err(bad("expired; authenticate again"));
    }
    Ok(claims)
}

/// What a token says, read without checking its signature: only for a
/// token a cell has just accepted (a proxy learns whose requests it
/// serves from the tokens the cell checked). Never a basis for granting
/// anything.
pub fn claims_of_accepted(token: &str) -> Option<Claims> {
    let token = token.strip_prefix("Bearer ").unwrap_or(token).trim();
    let (payload, _) = token.split_once('.')?;
    let payload = URL_SAFE_NO_PAD.decode(payload).ok()?;
    serde_json::from_slice::<Claims>(&payload).ok()
}

/// A fresh random secret for a new signing key.
pub fn new_secret() -> Result<Vec<u8>, ApiError> {
    use ring::rand::SecureRandom;
    let mut secret = vec![0u8; 32];
    ring::rand::SystemRandom::new()
        .fill(&mut secret)
        .map_err(|_| ApiError::internal("no randomness for a token key"))?;
    Ok(secret)
}

/// Milliseconds since the unix epoch by this machine's clock.
pub fn now_unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorCode;

    fn alice() -> UserRecord {
        UserRecord {
            name: "alice".into(),
            password_hash: Some("$argon2id$...".into()),
            roles: Default::default(),
        }
    }

    fn key(id: u64) -> TokenKey {
        TokenKey {
            id,
            secret: new_secret().expect("secret"),
        }
    }

    #[test]
    fn a_token_verifies_until_it_expires_and_only_under_its_key() {
        let (k1, k2) = (key(1), key(2));
        let token = sign(&k2, &alice(), 1_000, Duration::from_secs(10));
        let claims = verify(&[k1.clone(), k2.clone()], &token, 5_000).expect("valid");
        assert_eq!(claims.user, "alice");
        let expired = verify(&[k2.clone()], &token, 11_000).expect_err("expired");
        assert_eq!(expired.code, ErrorCode::InvalidAuthToken);
        assert!(verify(&[k1.clone()], &token, 5_000).is_err(), "key gone");
        let other_secret = TokenKey {
            id: 2,
            secret: k1.secret.clone(),
        };
        assert!(verify(&[other_secret], &token, 5_000).is_err());
    }

    #[test]
    fn an_accepted_tokens_user_is_read_back() {
        let token = sign(&key(1), &alice(), 1_000, Duration::from_secs(10));
        let user = |t: &str| claims_of_accepted(t).map(|c| c.user);
        assert_eq!(user(&token).as_deref(), Some("alice"));
        assert_eq!(user(&format!("Bearer {token}")).as_deref(), Some("alice"));
        assert_eq!(user("simple.42"), None);
    }

    #[test]
    fn a_changed_payload_or_garbage_is_refused() {
        let k = key(1);
        let token = sign(&k, &alice(), 1_000, Duration::from_secs(10));
        let (_, tag) = token.split_once('.').expect("two parts");
        let forged_claims = Claims {
            user: "root".into(),
            key_id: 1,
            expires_unix_ms: 11_000,
            password: alice().fingerprint(),
        };
        let forged = format!(
            "{}.{tag}",
            URL_SAFE_NO_PAD.encode(serde_json::to_vec(&forged_claims).expect("json"))
        );
        assert!(verify(&[k.clone()], &forged, 5_000).is_err());
        for garbage in ["", ".", "abc", "a.b", "simple.42", &token[1..]] {
            let e = verify(&[k.clone()], garbage, 5_000).expect_err(garbage);
            assert_eq!(e.code, ErrorCode::InvalidAuthToken);
        }
    }
}
