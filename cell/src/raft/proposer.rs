//! Group commit on the leader: client writes that arrive while earlier ones
//! are being committed travel together in ONE log entry
//! ([`Request::Batch`]), so one append, one fsync on each member and one
//! replication round carry them all.
//!
//! openraft 0.9 appends and fsyncs each `client_write` on its own, one
//! after the other (cell review P2), so batching has to happen before it,
//! in a [`Batcher`]: at most [`IN_FLIGHT`] entries are being committed at
//! once, and whatever queues up meanwhile becomes the next entry. A lone
//! write goes out at once, as itself.
//!
//! Every write of an entry shares its fate: all committed at one log
//! index, or all failed with the same error.

use super::command::{Reply, Request, Response};
use super::{errors, Raft};
use crate::batching::{self, Batcher};
use crate::metrics_catalog::WRITES_PER_ENTRY;
use latchkey_shared::lifecycle::Lifecycle;
use latchkey_shared::ApiError;
use std::time::Duration;

/// Entries being committed at once. One: openraft appends, fsyncs and
/// replicates entries one after the other anyway, so a second entry in
/// flight only splits what would have been one larger entry (measured with
/// `latchkey-bench --workloads put`, 64 writers, 3 members on 2 cores:
/// 12.1k puts/s with 1, 11.3k with 2, 10.4k with 4).
const IN_FLIGHT: usize = 1;

/// Writes in one entry at most.
const MAX_WRITES: usize = 512;

/// A committed write: its log index and its own result.
pub type Committed = Result<(u64, Response), ApiError>;

/// The way to the proposing task.
#[derive(Clone)]
pub struct Proposer {
    batcher: Batcher<Request, Committed>,
}

impl Proposer {
    /// Starts the proposing task under `lifecycle`. Entries are at most
    /// `max_bytes` (a single larger write goes alone), and each commit is
    /// given up after `timeout`.
    pub fn start(raft: Raft, lifecycle: &Lifecycle, max_bytes: usize, timeout: Duration) -> Self {
        let limits = batching::Limits {
            in_flight: IN_FLIGHT,
            max_items: MAX_WRITES,
            max_bytes,
        };
        let batcher = Batcher::start(lifecycle, limits, Request::size_hint, move |writes| {
            commit(raft.clone(), writes, timeout)
        });
        Proposer { batcher }
    }

    /// Proposes `req` and waits until it is committed and applied on this
    /// member (the leader).
    pub async fn propose(&self, req: Request) -> Committed {
        self.batcher
            .submit(req)
            .await
            .unwrap_or_else(|| Err(errors::fatal("the proposer stopped")))
    }
}

/// Commits `writes` as one entry; one answer per write, in order.
async fn commit(raft: Raft, mut writes: Vec<Request>, timeout: Duration) -> Vec<Committed> {
    let count = writes.len();
    metrics::histogram!(WRITES_PER_ENTRY.name).record(count as f64);
    let req = if count == 1 {
        writes.remove(0)
    } else {
        Request::Batch(writes)
    };
    let written = match tokio::time::timeout(timeout, raft.client_write(req)).await {
        Ok(Ok(written)) => written,
        Ok(Err(e)) => return vec![Err(errors::client_write(e)); count],
        Err(_) => return vec![Err(ApiError::timeout()); count],
    };
    let index = written.log_id.index;
    if count == 1 {
        return vec![Ok((index, written.data))];
    }
    match written.data.result {
        Ok(Reply::Batch(results)) if results.len() == count => {
            results.into_iter().map(|r| Ok((index, r))).collect()
        }
        other => {
            let e = ApiError::internal(format!(
                "a batch of {count} writes was applied as {other:?}"
            ));
            vec![Err(e); count]
        }
    }
}
