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
