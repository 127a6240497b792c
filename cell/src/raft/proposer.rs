//! Group commit on the leader: client writes that arrive while earlier ones
//! are being committed travel together in ONE log entry
//! ([`Request::Batch`]), so one append, one fsync on each member and one
//! replication round carry them all.
//!
//! openraft 0.9 appends and fsyncs each `client_write` on its own, one
//! after the other (cell review P2), so batching has to happen before it.
//! A single task takes writes in arrival order; at most [`IN_FLIGHT`]
//! entries are being committed at once, and whatever queues up meanwhile
//! becomes the next entry. A lone write goes out at once, as itself; under
//! load entries grow, up to [`MAX_WRITES`] writes or the request size limit.
//!
//! Every write of an entry shares its fate: all committed at one log
//! index, or all failed with the same error.

use super::command::{Reply, Request, Response};
use super::{errors, Raft};
use latchkey_shared::lifecycle::Lifecycle;
use latchkey_shared::ApiError;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot, Semaphore};

/// Entries being committed at once. More than one lets the next entry's
/// append overlap the previous one's replication.
const IN_FLIGHT: usize = 4;

/// Writes in one entry at most.
const MAX_WRITES: usize = 512;

/// A committed write: its log index and its own result.
pub type Committed = Result<(u64, Response), ApiError>;

struct Pending {
    req: Request,
    reply: oneshot::Sender<Committed>,
}

/// The way to the proposing task.
#[derive(Clone)]
pub struct Proposer {
    tx: mpsc::UnboundedSender<Pending>,
}

impl Proposer {
    /// Starts the proposing task under `lifecycle`. Entries are at most
    /// `max_bytes` (a single larger write goes alone), and each commit is
    /// given up after `timeout`.
    pub fn start(raft: Raft, lifecycle: &Lifecycle, max_bytes: usize, timeout: Duration) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let batcher = Batcher {
            raft,
            rx,
            in_flight: Arc::new(Semaphore::new(IN_FLIGHT)),
            max_bytes,
            timeout,
            lifecycle: lifecycle.clone(),
        };
        lifecycle.spawn(batcher.run());
        Proposer { tx }
    }

    /// Proposes `req` and waits until it is committed and applied on this
    /// member (the leader).
    pub async fn propose(&self, req: Request) -> Committed {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Pending { req, reply })
            .map_err(|_| stopped())?;
        rx.await.map_err(|_| stopped())?
    }
}

fn stopped() -> ApiError {
    errors::fatal("the proposer stopped")
}

struct Batcher {
    raft: Raft,
    rx: mpsc::UnboundedReceiver<Pending>,
    in_flight: Arc<Semaphore>,
    max_bytes: usize,
    timeout: Duration,
    lifecycle: Lifecycle,
}

impl Batcher {
    async fn run(mut self) {
        let mut carried: Option<Pending> = None;
        loop {
            let first = match carried.take() {
                Some(p) => p,
                None => match self.rx.recv().await {
                    Some(p) => p,
                    None => return,
                },
            };
            // Waiting for a slot is what lets writes queue up behind the
            // entries in flight and go out together.
            let Ok(permit) = self.in_flight.clone().acquire_owned().await else {
                return;
            };
            let mut bytes = first.req.size_hint();
            let mut batch = vec![first];
            while batch.len() < MAX_WRITES {
                let Ok(next) = self.rx.try_recv() else { break };
                let size = next.req.size_hint();
                if bytes + size > self.max_bytes {
                    carried = Some(next);
                    break;
                }
                bytes += size;
                batch.push(next);
            }
            // A caller that gave up before its write went out is not
            // proposed at all.
            batch.retain(|p| !p.reply.is_closed());
            if batch.is_empty() {
                continue;
            }
            let raft = self.raft.clone();
            let timeout = self.timeout;
            self.lifecycle.spawn(async move {
                commit(&raft, batch, timeout).await;
                drop(permit);
            });
        }
    }
}

/// Commits `batch` as one entry and answers each caller.
async fn commit(raft: &Raft, mut batch: Vec<Pending>, timeout: Duration) {
    metrics::histogram!("latchkey_writes_per_entry").record(batch.len() as f64);
    let req = if batch.len() == 1 {
        batch[0].req.clone()
    } else {
        Request::Batch(batch.iter().map(|p| p.req.clone()).collect())
    };
    let result = match tokio::time::timeout(timeout, raft.client_write(req)).await {
        Ok(r) => r.map_err(errors::client_write),
        Err(_) => Err(ApiError::timeout()),
    };
    let written = match result {
        Ok(written) => written,
        Err(e) => {
            batch
                .into_iter()
                .for_each(|p| drop(p.reply.send(Err(e.clone()))));
            return;
        }
    };
    let index = written.log_id.index;
    if batch.len() == 1 {
        let p = batch.remove(0);
        drop(p.reply.send(Ok((index, written.data))));
        return;
    }
    match written.data.result {
        Ok(Reply::Batch(results)) if results.len() == batch.len() => {
            for (p, response) in batch.into_iter().zip(results) {
                drop(p.reply.send(Ok((index, response))));
            }
        }
        other => {
            let e = ApiError::internal(format!(
                "a batch of {} writes was applied as {other:?}",
                batch.len()
            ));
            batch
                .into_iter()
                .for_each(|p| drop(p.reply.send(Err(e.clone()))));
        }
    }
}
