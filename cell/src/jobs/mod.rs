//! Background jobs that act through the node like a client would: each is
//! a struct with `async fn run(self)`, spawned and owned by the cell's
//! lifecycle.
//!
//! - [`auto_compaction`]: the leader compacts history by retention.
//! - [`publish_member`]: this member announces its client URL.
//! - [`snapshot_trigger`]: a snapshot every so many client writes.

pub mod auto_compaction;
pub mod publish_member;
pub mod snapshot_trigger;
