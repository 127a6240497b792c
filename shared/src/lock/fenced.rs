//! [`FencedResource`]: the other half of a fencing token. A resource that
//! a lock protects keeps the highest token it has accepted, per resource
//! name, and refuses a write with a lower one: a holder that paused past
//! its session (a GC pause, a stopped VM) and then wakes up still
//! believing it holds the lock is turned away, because a later holder's
//! token is higher.
//!
//! Equal tokens are accepted: one holder writes many times under one
//! grant. The check and the update are one step under a lock, so two
//! writers cannot both pass with tokens in the wrong order.

use std::collections::HashMap;
use std::sync::Mutex;

/// A write refused: its token is below one already accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("fencing token {offered} is stale: token {highest} was already accepted")]
pub struct StaleToken {
    pub offered: i64,
    pub highest: i64,
}

#[derive(Default)]
pub struct FencedResource {
    highest: Mutex<HashMap<String, i64>>,
}

impl FencedResource {
    pub fn new() -> FencedResource {
        FencedResource::default()
    }

    /// Accepts a write to `resource` under `token` if no higher token was
    /// accepted for it; the token becomes the one to beat.
    pub fn accept(&self, resource: &str, token: i64) -> Result<(), StaleToken> {
        let mut highest = self.highest.lock().unwrap_or_else(|p| p.into_inner());
        let best = highest.entry(resource.to_string()).or_insert(token);
        if token < *best {
            return Err(StaleToken {
                offered: token,
                highest: *best,
            });
        }
        *best = token;
        Ok(())
    }

    /// The highest token accepted for `resource`, if any.
    pub fn highest(&self, resource: &str) -> Option<i64> {
        self.highest
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(resource)
            .copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lower_token_is_refused_an_equal_or_higher_one_accepted_per_resource() {
        let resource = FencedResource::new();
        assert_eq!(resource.accept("disk", 7), Ok(()));
        assert_eq!(resource.accept("disk", 7), Ok(()), "the same holder again");
        assert_eq!(resource.accept("disk", 12), Ok(()));
        assert_eq!(
            resource.accept("disk", 9),
            Err(StaleToken {
                offered: 9,
                highest: 12
            })
        );
        assert_eq!(
            resource.accept("other", 3),
            Ok(()),
            "tokens are per resource"
        );
        assert_eq!(resource.highest("disk"), Some(12));
        assert_eq!(resource.highest("none"), None);
    }
}
