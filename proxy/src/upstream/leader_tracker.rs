//! [`LeaderTracker`]: one task per cell that asks every member for its
//! Status, to learn which member id answers at each address, who leads,
//! and which members are up. Calls learn the leader faster from
//! `NotLeader { leader }` hints and wake the tracker when they meet a
//! leader change; the tracker's probes also answer `/readyz`.

use super::cell_client::{Cell, HasHeader};
use latchkey_shared::client::call;
use latchkey_shared::etcd_methods::maintenance::STATUS;
use latchkey_shared::etcdpb::{PbStatusRequest, PbStatusResponse};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// How often every member is probed when nothing happens. Three small
/// calls a second per cell; a leader change is noticed sooner by the
/// call that meets it.
const PROBE_INTERVAL: Duration = Duration::from_secs(1);

/// How long one probe may take: a member that does not answer Status in
/// a second is counted down until it does.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// Least time between two probe rounds, so a burst of failing calls does
/// not turn into a burst of probes.
const MIN_PROBE_GAP: Duration = Duration::from_millis(50);

pub struct LeaderTracker {
    pub cell: Cell,
}

impl LeaderTracker {
    pub async fn run(self, shutdown: CancellationToken) {
        loop {
            self.probe().await;
            tokio::time::sleep(MIN_PROBE_GAP).await;
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(PROBE_INTERVAL) => {}
                _ = self.cell.leader_changed.notified() => {}
            }
        }
    }

    /// Probes every member at once; the leader is the one a majority of
    /// the answers name (any answer, when they disagree during an
    /// election: the next round settles it).
    async fn probe(&self) {
        let probes = self.cell.members.iter().enumerate().map(|(i, m)| {
            let channel = m.channel.clone();
            async move {
                let mut request = tonic::Request::new(PbStatusRequest {});
                request.set_timeout(PROBE_TIMEOUT);
                let answer = tokio::time::timeout(
                    PROBE_TIMEOUT,
                    call::unary::<PbStatusRequest, PbStatusResponse>(channel, STATUS, request),
                )
                .await;
                (i, answer)
            }
        });
        let mut leaders = Vec::new();
        for (i, answer) in futures::future::join_all(probes).await {
            match answer {
                Ok(Ok(status)) => {
                    self.cell.saw_header(i, status.header());
                    if status.leader != 0 {
                        leaders.push(status.leader);
                    }
                }
                _ => self.cell.members[i].failed(),
            }
        }
        leaders.sort_unstable();
        let named = leaders
            .chunk_by(|a, b| a == b)
            .max_by_key(|run| run.len())
            .map(|run| run[0]);
        self.cell.set_leader(named);
    }
}
