//! Group commit's queue: requests that arrive while earlier groups are
//! under way travel together as the next group.
//!
//! A single task takes requests in arrival order. At most `in_flight`
//! groups are under way at once, and whatever queues up meanwhile becomes
//! the next group; a lone request goes out at once, alone. Under load,
//! groups grow up to `max_items` requests or `max_bytes`. The leader uses
//! it to put concurrent writes into one log entry (`crate::raft::proposer`),
//! a follower to forward concurrent writes to the leader in one message.

use latchkey_shared::lifecycle::Lifecycle;
use std::future::Future;
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot, Semaphore};

/// How a group is sized and how many go at once.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub in_flight: usize,
    pub max_items: usize,
    /// A single larger request goes alone.
    pub max_bytes: usize,
}

struct Queued<T, R> {
    item: T,
    reply: oneshot::Sender<R>,
}

/// The way to a batching task. `R` is each request's own answer.
pub struct Batcher<T, R> {
    tx: mpsc::UnboundedSender<Queued<T, R>>,
}

impl<T, R> Clone for Batcher<T, R> {
    fn clone(&self) -> Self {
        Batcher {
            tx: self.tx.clone(),
        }
    }
}

impl<T: Send + 'static, R: Send + 'static> Batcher<T, R> {
    /// Starts the task under `lifecycle`. `size` measures a request for
    /// `max_bytes`; `send` carries one group and answers each of its
    /// requests, in order (a missing answer drops that caller's reply).
    pub fn start<S, F, Fut>(lifecycle: &Lifecycle, limits: Limits, size: S, send: F) -> Self
    where
        S: Fn(&T) -> usize + Send + 'static,
        F: Fn(Vec<T>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Vec<R>> + Send + 'static,
    {
        let (tx, rx) = mpsc::unbounded_channel();
        lifecycle.spawn(run(rx, lifecycle.clone(), limits, size, send));
        Batcher { tx }
    }

    /// Queues `item` and waits for its answer; `None` once the task has
    /// stopped (shutdown).
    pub async fn submit(&self, item: T) -> Option<R> {
        let (reply, rx) = oneshot::channel();
        self.tx.send(Queued { item, reply }).ok()?;
        rx.await.ok()
    }
}

async fn run<T, R, S, F, Fut>(
    mut rx: mpsc::UnboundedReceiver<Queued<T, R>>,
    lifecycle: Lifecycle,
    limits: Limits,
    size: S,
    send: F,
) where
    T: Send + 'static,
    R: Send + 'static,
    S: Fn(&T) -> usize,
    F: Fn(Vec<T>) -> Fut,
    Fut: Future<Output = Vec<R>> + Send + 'static,
{
    let slots = Arc::new(Semaphore::new(limits.in_flight.max(1)));
    let mut carried: Option<Queued<T, R>> = None;
    loop {
        let first = match carried.take() {
            Some(q) => q,
            None => match rx.recv().await {
                Some(q) => q,
                None => return,
            },
        };
        // Waiting for a slot is what lets requests queue up behind the
        // groups under way and go out together.
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let mut bytes = size(&first.item);
        let mut group = vec![first];
        while group.len() < limits.max_items {
            let Ok(next) = rx.try_recv() else { break };
            let next_bytes = size(&next.item);
            if bytes + next_bytes > limits.max_bytes {
                carried = Some(next);
                break;
            }
            bytes += next_bytes;
            group.push(next);
        }
        // A caller that gave up before its request went out is not sent.
        group.retain(|q| !q.reply.is_closed());
        if group.is_empty() {
            continue;
        }
        let (items, replies): (Vec<T>, Vec<oneshot::Sender<R>>) =
            group.into_iter().map(|q| (q.item, q.reply)).unzip();
        let answers = send(items);
        lifecycle.spawn(async move {
            for (reply, answer) in replies.into_iter().zip(answers.await) {
                drop(reply.send(answer));
            }
            drop(slot);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;
    use std::time::Duration;

    type Groups = Arc<Mutex<Vec<Vec<usize>>>>;

    /// A batcher of numbers, one group at a time, each group taking
    /// `takes` to send and answered with `answer` per number; what it sent
    /// is recorded group by group. A number's size is itself.
    fn recording_batcher(
        lifecycle: &Lifecycle,
        max_bytes: usize,
        takes: Duration,
        answer: fn(usize) -> usize,
    ) -> (Batcher<usize, usize>, Groups) {
        let groups = Groups::default();
        let seen = groups.clone();
        let limits = Limits {
            in_flight: 1,
            max_items: 100,
            max_bytes,
        };
        let batcher = Batcher::start(
            lifecycle,
            limits,
            |n: &usize| *n,
            move |items: Vec<usize>| {
                seen.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(items.clone());
                async move {
                    tokio::time::sleep(takes).await;
                    items.into_iter().map(answer).collect()
                }
            },
        );
        (batcher, groups)
    }

    async fn submit_all(batcher: &Batcher<usize, usize>, items: &[usize]) -> Vec<Option<usize>> {
        futures::future::join_all(items.iter().map(|n| batcher.submit(*n))).await
    }

    /// While one group is under way, the requests that arrive meanwhile
    /// go out together as the next group, and each caller gets its own
    /// answer.
    #[tokio::test]
    async fn requests_queued_behind_a_group_go_out_together_each_answered() {
        let lifecycle = Lifecycle::new();
        let (batcher, groups) =
            recording_batcher(&lifecycle, 1000, Duration::from_millis(50), |i| i * 10);
        let items: Vec<usize> = (0..20).collect();
        let answers = submit_all(&batcher, &items).await;
        assert_eq!(
            answers,
            items.iter().map(|i| Some(i * 10)).collect::<Vec<_>>()
        );
        let groups = groups.lock().unwrap_or_else(|e| e.into_inner()).clone();
        assert!(groups.len() < 20, "every request went alone: {groups:?}");
        let mut all: Vec<usize> = groups.concat();
        all.sort_unstable();
        assert_eq!(all, items, "each sent exactly once");
        lifecycle.shutdown(Duration::from_secs(1)).await;
    }

    /// A group never exceeds its byte budget, but one large request still
    /// goes (alone).
    #[tokio::test]
    async fn groups_keep_to_the_byte_budget() {
        let lifecycle = Lifecycle::new();
        let (batcher, groups) = recording_batcher(&lifecycle, 10, Duration::from_millis(20), |n| n);
        let answers = submit_all(&batcher, &[4, 4, 4, 25, 3, 3, 3, 3]).await;
        assert!(answers.iter().all(Option::is_some));
        for group in groups.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            let bytes: usize = group.iter().sum();
            assert!(bytes <= 10 || group.len() == 1, "{group:?} is over budget");
        }
        lifecycle.shutdown(Duration::from_secs(1)).await;
    }
}
