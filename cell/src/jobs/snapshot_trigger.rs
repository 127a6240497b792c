//! Snapshots by client writes, not only by log entries. openraft takes a
//! snapshot every `--snapshot-entries` log entries; with group commit one
//! entry may carry hundreds of writes, so under load the log (and a
//! restart's replay) would grow that many times longer between snapshots.
//! This job also asks for a snapshot once as many writes have been applied
//! since it last asked, on every member, as openraft's policy does.

use crate::raft::Raft;
use crate::state_machine::store::SharedState;
use std::time::Duration;

/// How often the applied write count is looked at.
const CHECK: Duration = Duration::from_millis(200);

pub struct SnapshotTrigger {
    pub raft: Raft,
    pub state: SharedState,
    /// Writes between snapshots (`--snapshot-entries`).
    pub every: u64,
}

impl SnapshotTrigger {
    /// Runs until dropped (it holds nothing that must be finished).
    pub async fn run(self) {
        let mut asked_at = self.state.read(|s| s.writes_applied);
        loop {
            tokio::time::sleep(CHECK).await;
            let applied = self.state.read(|s| s.writes_applied);
            // The count starts over after a restart or a snapshot install.
            asked_at = asked_at.min(applied);
            if applied - asked_at >= self.every {
                if let Err(e) = self.raft.trigger().snapshot().await {
                    tracing::debug!(error = %e, "snapshot not triggered");
                    return;
                }
                asked_at = applied;
            }
        }
    }
}
