//! Password hashes: argon2id with the argon2 crate's default parameters
//! (19 MiB, 2 passes: about 20-40 ms on this project's machines in a
//! release build), a random 128-bit salt, stored as a PHC string. Hashing
//! and checking run on a blocking thread, never on a runtime worker.

use crate::ApiError;
use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use argon2::Argon2;

/// The PHC string of `password` under a fresh salt.
pub fn hash(password: &str) -> Result<String, ApiError> {
    use ring::rand::SecureRandom;
    let mut salt = [0u8; 16];
    ring::rand::SystemRandom::new()
        .fill(&mut salt)
        .map_err(|_| ApiError::internal("no randomness for a password salt"))?;
    let salt = SaltString::encode_b64(&salt)
        .map_err(|e| ApiError::internal(format!("password salt: {e}")))?;
    Argon2::default()
        .hash_password(password.as_bytes(), &salt)
        .map(|h| h.to_string())
        .map_err(|e| ApiError::internal(format!("password hash: {e}")))
}

/// Whether `password` matches `stored` (constant time in the password).
/// With no stored hash (an unknown user, or one without a password) a
/// fixed hash is checked instead, so that the answer takes as long and a
/// caller cannot tell an unknown user from a wrong password.
pub fn verify(password: &str, stored: Option<&str>) -> bool {
    // The hash of a password nobody has, with the default parameters.
    const DECOY: &str = "$argon2id$v=19$m=19456,t=2,p=1$bGF0Y2hrZXktZGVjb3k$\
                         0K4YHn1L3iTUTSdV7z3dS7uZ6s2Wq7hWYcXx5lH0e3M";
    let (candidate, real) = match stored {
        Some(h) => (h, true),
        None => (DECOY, false),
    };
    let matches = PasswordHash::new(candidate)
        .map(|parsed| {
            Argon2::default()
                .verify_password(password.as_bytes(), &parsed)
                .is_ok()
        })
        .unwrap_or(false);
    matches && real
}

/// Passwords found right lately, so that a client that authenticates for
/// every stream it opens (etcd's Go client does) pays for argon2 once per
/// [`RecentlyVerified::ttl`], not per stream. Holds an HMAC of each
/// password under a key made at start and never stored, with the hash it
/// matched: a changed password (another hash) misses.
pub struct RecentlyVerified {
    key: ring::hmac::Key,
    ttl: std::time::Duration,
    entries: std::sync::Mutex<std::collections::HashMap<String, Verified>>,
}

struct Verified {
    tag: Vec<u8>,
    hash: String,
    at: tokio::time::Instant,
}

/// Users remembered at most; past it, the expired go first, then all.
const MAX_VERIFIED: usize = 65_536;

impl RecentlyVerified {
    pub fn new(ttl: std::time::Duration) -> Result<RecentlyVerified, ApiError> {
        let key =
            ring::hmac::Key::generate(ring::hmac::HMAC_SHA256, &ring::rand::SystemRandom::new())
                .map_err(|_| ApiError::internal("no randomness for the password check cache"))?;
        Ok(RecentlyVerified {
            key,
            ttl,
            entries: Default::default(),
        })
    }

    pub fn ttl(&self) -> std::time::Duration {
        self.ttl
    }

    /// Whether `password` was found to match `hash` for `user` within the
    /// ttl (compared in constant time).
    pub fn holds(&self, user: &str, password: &str, hash: &str, now: tokio::time::Instant) -> bool {
        let entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        entries.get(user).is_some_and(|v| {
            v.hash == hash
                && now.saturating_duration_since(v.at) < self.ttl
                && ring::hmac::verify(&self.key, password.as_bytes(), &v.tag).is_ok()
        })
    }

    /// `password` was just found to match `hash` for `user`.
    pub fn remember(&self, user: &str, password: &str, hash: &str, now: tokio::time::Instant) {
        let tag = ring::hmac::sign(&self.key, password.as_bytes())
            .as_ref()
            .to_vec();
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        if entries.len() >= MAX_VERIFIED && !entries.contains_key(user) {
            let ttl = self.ttl;
            entries.retain(|_, v| now.saturating_duration_since(v.at) < ttl);
            if entries.len() >= MAX_VERIFIED {
                entries.clear();
            }
        }
        entries.insert(
            user.to_string(),
            Verified {
                tag,
                hash: hash.to_string(),
                at: now,
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_right_password_matches_and_nothing_else() {
        let stored = hash("s3cret").expect("hash");
        assert!(stored.starts_with("$argon2id$"), "{stored}");
        assert!(verify("s3cret", Some(&stored)));
        assert!(!verify("s3cret ", Some(&stored)));
        assert!(!verify("", Some(&stored)));
        assert!(!verify("s3cret", None));
        assert!(!verify("s3cret", Some("not a hash")));
        assert_ne!(hash("s3cret").expect("hash"), stored, "salted");
    }

    #[test]
    fn a_recent_check_holds_for_the_same_password_and_hash_until_its_ttl() {
        let recent = RecentlyVerified::new(std::time::Duration::from_secs(60)).expect("key");
        let t0 = tokio::time::Instant::now();
        recent.remember("alice", "pw", "$hash1", t0);
        assert!(recent.holds("alice", "pw", "$hash1", t0));
        assert!(
            !recent.holds("alice", "pw ", "$hash1", t0),
            "another password"
        );
        assert!(
            !recent.holds("alice", "pw", "$hash2", t0),
            "the password changed"
        );
        assert!(!recent.holds("bob", "pw", "$hash1", t0), "another user");
        let later = t0 + std::time::Duration::from_secs(61);
        assert!(!recent.holds("alice", "pw", "$hash1", later), "expired");
    }

    #[test]
    fn the_decoy_is_a_hash_that_parses() {
        // An unknown user must cost what a wrong password costs: the decoy
        // has to parse, or its check would return at once.
        let started = std::time::Instant::now();
        assert!(!verify("anything", None));
        let decoy = started.elapsed();
        assert!(
            PasswordHash::new(
                "$argon2id$v=19$m=19456,t=2,p=1$bGF0Y2hrZXktZGVjb3k$\
                 0K4YHn1L3iTUTSdV7z3dS7uZ6s2Wq7hWYcXx5lH0e3M"
            )
            .is_ok(),
            "decoy parses ({decoy:?})"
        );
    }
}
