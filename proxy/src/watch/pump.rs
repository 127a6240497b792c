//! [`Pump`]: the task that feeds one shared watch: it moves its upstream
//! watch's answers into the [`SharedWatch`], ends it when the member says
//! the watch is over (compacted, cancelled), and when the member's stream
//! fails re-creates the upstream watch on another member from the first
//! revision not yet published, so subscribers see no gap and no repeat.

use super::member_stream::MemberStreamHandle;
use super::shared_watch::{Cancel, SharedWatch};
use super::upstream_answer::Answer;
use super::upstream_watches::UpstreamWatches;
use super::watch_key::WatchKey;
use crate::metrics_catalog::{UPSTREAM_WATCHES, WATCH_EVENTS_IN};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Pause between attempts to resume a shared watch on another member.
const RESUME_BACKOFF: Duration = Duration::from_millis(200);

/// A shared watch's upstream watch: the member stream it is on, its id
/// there and its answers.
pub struct Upstream {
    pub stream: MemberStreamHandle,
    pub watch_id: i64,
    pub answers: mpsc::UnboundedReceiver<Answer>,
}

/// Moves one shared watch's upstream answers into it.
pub struct Pump {
    /// Where the watch is resumed when its member's stream fails.
    pub upstream: Arc<UpstreamWatches>,
    /// Called once when the shared watch ends (the coalescer forgets it).
    pub on_end: Box<dyn Fn() + Send + Sync>,
    pub key: WatchKey,
    pub shared: Arc<SharedWatch>,
}

impl Pump {
    /// Feeds the shared watch from `upstream` until the watch ends or
    /// `stop` (nobody watches any more) is cancelled; when the member's
    /// stream fails, resumes on another member.
    pub async fn run(self, mut upstream: Upstream, stop: CancellationToken) {
        metrics::gauge!(UPSTREAM_WATCHES.name).increment(1.0);
        loop {
            tokio::select! {
                _ = stop.cancelled() => {
                    upstream.stream.cancel(upstream.watch_id);
                    break;
                }
                answer = upstream.answers.recv() => match answer {
                    Some(answer) => {
                        if !self.apply(answer) {
                            break;
                        }
                    }
                    // The member's stream failed: resume elsewhere.
                    None => match self.resume(&stop).await {
                        Some(resumed) => upstream = resumed,
                        None => break,
                    },
                },
            }
        }
        metrics::gauge!(UPSTREAM_WATCHES.name).decrement(1.0);
    }

    /// Applies one answer; false when the shared watch has ended.
    fn apply(&self, answer: Answer) -> bool {
        match answer {
            Answer::Revisions { revisions, .. } => {
                let events: usize = revisions.iter().map(|r| r.events.len()).sum();
                metrics::counter!(WATCH_EVENTS_IN.name).increment(events as u64);
                for revision in revisions {
                    self.shared.publish(revision);
                }
                true
            }
            Answer::Progress { revision, .. } => {
                self.shared.progress(revision);
                true
            }
            Answer::Created { .. } => true,
            Answer::Compacted {
                compact_revision, ..
            } => {
                self.end(Cancel::Compacted { compact_revision });
                false
            }
            Answer::Cancelled { reason, .. } => {
                self.end(Cancel::Ended { reason });
                false
            }
        }
    }

    fn end(&self, cancel: Cancel) {
        self.shared.end(cancel);
        (self.on_end)();
    }

    /// Re-creates the watch on another member from the first revision not
    /// published; `None` when it cannot be resumed (compacted) or nobody
    /// wants it any more.
    async fn resume(&self, stop: &CancellationToken) -> Option<Upstream> {
        loop {
            if stop.is_cancelled() {
                return None;
            }
            let from = self.shared.resume_from();
            match self.upstream.open(&self.key, from).await {
                Ok(opened) => {
                    tracing::info!(revision = from, "shared watch resumed on another member");
                    return Some(Upstream {
                        stream: opened.stream,
                        watch_id: opened.watch_id,
                        answers: opened.answers,
                    });
                }
                // Subscribers learn the compact revision, as from a member
                // (gRPC clients then see etcd's ErrCompacted).
                Err(e) if e.code == latchkey_shared::ErrorCode::Compacted => {
                    self.end(Cancel::Compacted {
                        compact_revision: e.compact_revision().unwrap_or(0),
                    });
                    return None;
                }
                Err(e) => {
                    tracing::debug!(error = %e, "resuming a shared watch failed; trying again");
                    tokio::select! {
                        _ = stop.cancelled() => return None,
                        _ = tokio::time::sleep(RESUME_BACKOFF) => {}
                    }
                }
            }
        }
    }
}
