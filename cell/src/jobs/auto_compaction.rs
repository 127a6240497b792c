//! Automatic compaction by retention, like etcd's `--auto-compaction-mode`
//! and `--auto-compaction-retention`: the leader proposes a `Compact` that
//! keeps the last N revisions, or the revisions of the last duration.

use crate::config::Retention;
use crate::node::CellNode;
use crate::raft::command::Request;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// How often revision mode looks at the revision (etcd: 5 minutes).
const REVISION_CHECK: Duration = Duration::from_secs(5);

/// The leader's compaction loop; idle on followers.
pub struct AutoCompaction {
    pub node: Arc<CellNode>,
    pub retention: Retention,
}

impl AutoCompaction {
    /// Runs until dropped (it holds nothing that must be finished).
    pub async fn run(self) {
        let AutoCompaction { node, retention } = self;
        let check = match retention {
            Retention::Off => return,
            Retention::Revisions(_) => REVISION_CHECK,
            // Sample the revision ten times per retention period.
            Retention::Period(d) => (d / 10).max(Duration::from_secs(1)),
        };
        // (when, revision) samples, oldest first, for periodic mode.
        let mut samples: VecDeque<(Instant, i64)> = VecDeque::new();
        loop {
            tokio::time::sleep(check).await;
            let (revision, compacted) = node
                .state
                .read(|s| (s.keys.revision(), s.keys.compact_revision()));
            let now = Instant::now();
            let target = match retention {
                Retention::Off => return,
                Retention::Revisions(n) => revision - n,
                Retention::Period(d) => {
                    samples.push_back((now, revision));
                    // The newest sample at least `d` old is the compaction point.
                    let mut target = 0;
                    while let Some(&(at, rev)) = samples.front() {
                        if now.duration_since(at) < d {
                            break;
                        }
                        target = rev;
                        samples.pop_front();
                    }
                    target
                }
            };
            if target <= compacted || !node.is_leader() {
                continue;
            }
            match node.write(Request::Compact { revision: target }).await {
                Ok(resp) => match resp.result {
                    Ok(_) => tracing::info!(revision = target, "auto-compaction"),
                    Err(e) => tracing::debug!(error = %e, "auto-compaction skipped"),
                },
                Err(e) => tracing::warn!(error = %e, "auto-compaction failed; will retry"),
            }
        }
    }
}
