//! [`ClientWatches`]: the limits on client watches (gRPC and SSE) a proxy
//! holds: `--max-watches` in all, `--max-watches-per-stream` on one gRPC
//! stream. A client over either gets `too_many_watches` and nothing is
//! created, instead of growing the proxy (and its member streams) without
//! bound (review P4). A [`Held`] is one client watch's place, counted in
//! `latchkey_proxy_client_watches` until it is dropped.

use crate::metrics_catalog::CLIENT_WATCHES;
use latchkey_shared::ApiError;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

pub struct ClientWatches {
    /// Client watches one proxy holds at most.
    limit: usize,
    /// Watches one client gRPC stream holds at most.
    pub per_stream: usize,
    held: Arc<AtomicUsize>,
}

/// One client watch's place; given back when dropped.
pub struct Held {
    held: Arc<AtomicUsize>,
    api: &'static str,
}

impl ClientWatches {
    pub fn new(limit: usize, per_stream: usize) -> ClientWatches {
        ClientWatches {
            limit,
            per_stream,
            held: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// A place for one more client watch of `api` (`grpc`, `sse`), or
    /// `too_many_watches` when the proxy holds its limit.
    pub fn take(&self, api: &'static str) -> Result<Held, ApiError> {
        if self.held.fetch_add(1, Ordering::Relaxed) >= self.limit {
            self.held.fetch_sub(1, Ordering::Relaxed);
            return Err(ApiError::too_many_watches("this proxy", self.limit));
        }
        metrics::gauge!(CLIENT_WATCHES.name, "api" => api).increment(1.0);
        Ok(Held {
            held: self.held.clone(),
            api,
        })
    }

    /// Client watches held now.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.held.fetch_sub(1, Ordering::Relaxed);
        metrics::gauge!(CLIENT_WATCHES.name, "api" => self.api).decrement(1.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_watch_over_the_limit_is_refused_and_a_place_given_back_is_free_again() {
        let watches = ClientWatches::new(2, 1);
        let a = watches.take("grpc").expect("one");
        let _b = watches.take("sse").expect("two");
        let refused = watches.take("grpc").err().expect("three is over");
        assert_eq!(refused.code, latchkey_shared::ErrorCode::TooManyWatches);
        assert_eq!(watches.held(), 2);
        drop(a);
        assert!(watches.take("grpc").is_ok());
    }
}
