//! The serializable read cache (DESIGN section 4; issue 12).
//!
//! - [`read_cache`]: [`ReadCache`], ranges kept current by the proxy's own
//!   watches, bounded by `--cache-bytes`, least recently used out first.
//! - [`cached_range`]: [`cached_range::CachedRange`], one range's live
//!   keys as of one revision, answering Range requests as the cell would.
//! - [`slots`]: which ranges it holds, and which one goes when it is full.
//! - [`leader_samples`]: the leader's revision as sampled, which every
//!   cached answer must reach.
//! - [`client_floor`]: [`ClientFloors`], the revision each client was last
//!   answered at, so its reads through this proxy never go backwards.
//!
//! The Range path that asks it is [`ops::kv::range`](crate::ops::kv::range).

pub mod cached_range;
pub mod client_floor;
pub mod leader_samples;
pub mod read_cache;
pub mod slots;

pub use client_floor::ClientFloors;
pub use read_cache::ReadCache;
