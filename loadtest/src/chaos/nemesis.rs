//! The nemesis: does each fault of the plan to the running cell and its
//! clients, and undoes it at heal. Network faults are iptables rules
//! between the members' own loopback addresses; process faults are signals
//! to the members and to the lock-holder processes; disk faults are fail
//! points set on a member through its metrics address.

use super::schedule::{FaultKind, Step};
use latchkey_testkit::{http_request, Cluster, Holders, NetFaults};
use std::time::Duration;

/// The fail point a log-append crash arms.
pub const LOG_APPEND_FAIL_POINT: &str = "log-append-before-fsync";
/// The fail point a commit crash arms.
pub const COMMIT_FAIL_POINT: &str = "committed-before-answer";

/// A fault as done: what, to whom.
#[derive(Debug, Clone)]
pub struct Injected {
    pub kind: FaultKind,
    pub detail: String,
}

pub struct Nemesis<'a> {
    pub cluster: &'a mut Cluster,
    holders: &'a Holders,
    net: NetFaults,
    /// Members SIGSTOPped, SIGKILLed, or armed to crash, to bring back at
    /// heal.
    stopped: Vec<u64>,
    killed: Vec<u64>,
    paused_holder: Option<u32>,
    /// The leader when the last fault was injected.
    pub leader_before: Option<u64>,
}

impl<'a> Nemesis<'a> {
    pub fn new(cluster: &'a mut Cluster, holders: &'a Holders) -> Nemesis<'a> {
        Nemesis {
            cluster,
            holders,
            net: NetFaults::new(),
            stopped: Vec::new(),
            killed: Vec::new(),
            paused_holder: None,
            leader_before: None,
        }
    }

    fn ip(&self, id: u64) -> String {
        let peer = &self.cluster.member(id).peer;
        peer.rsplit_once(':')
            .map_or(peer.clone(), |(ip, _)| ip.to_string())
    }

    fn ips(&self, ids: &[u64]) -> Vec<String> {
        ids.iter().map(|id| self.ip(*id)).collect()
    }

    /// The leader most running members name, without waiting.
    pub async fn leader(&self) -> Option<u64> {
        let mut votes: Vec<u64> = Vec::new();
        for id in self.cluster.running() {
            if let Some(l) = self.cluster.leader_seen_by(id).await {
                votes.push(l);
            }
        }
        votes.sort_unstable();
        let mut best = None;
        let mut best_count = 0;
        for l in &votes {
            let count = votes.iter().filter(|v| *v == l).count();
            if count > best_count {
                best = Some(*l);
                best_count = count;
            }
        }
        best.filter(|l| self.cluster.running().contains(l))
    }

    fn others(&self, id: u64) -> Vec<u64> {
        self.cluster
            .members
            .iter()
            .map(|m| m.id)
            .filter(|m| *m != id)
            .collect()
    }

    /// Does `step`'s fault; `Err` says why it could not be done now (no
    /// leader to hit, say), and nothing was done.
    pub async fn inject(&mut self, step: &Step) -> Result<Injected, String> {
        let ids: Vec<u64> = self.cluster.members.iter().map(|m| m.id).collect();
        self.leader_before = self.leader().await;
        let needs_leader = matches!(
            step.kind,
            FaultKind::LeaderPartition
                | FaultKind::OneWayPartition
                | FaultKind::LeaderKill
                | FaultKind::LeaderPause
                | FaultKind::CommitCrash
        );
        let leader = if needs_leader {
            Some(self.leader().await.ok_or("no leader to hit")?)
        } else {
            None
        };
        let any = ids[(step.pick % ids.len() as u64) as usize];
        let detail = match step.kind {
            FaultKind::LeaderPartition => {
                let l = leader.expect("looked up above");
                let (a, b) = (self.ips(&[l]), self.ips(&self.others(l)));
                self.net.split(&a, &b)?;
                format!("leader {l} cut off both ways")
            }
            FaultKind::MinorityPartition => {
                let leader = self.leader().await;
                let followers: Vec<u64> =
                    ids.iter().copied().filter(|i| Some(*i) != leader).collect();
                let f = followers[(step.pick % followers.len() as u64) as usize];
                let (a, b) = (self.ips(&[f]), self.ips(&self.others(f)));
                self.net.split(&a, &b)?;
                format!("member {f} cut off both ways")
            }
            FaultKind::OneWayPartition => {
                let l = leader.expect("looked up above");
                let from = self.ip(l);
                for to in self.ips(&self.others(l)) {
                    self.net.drop(&from, &to, 1.0)?;
                }
                format!("packets from leader {l} to its peers dropped")
            }
            FaultKind::LossyLink => {
                let from = self.ip(any);
                for to in self.ips(&self.others(any)) {
                    self.net.drop(&from, &to, 0.3)?;
                }
                format!("member {any} loses 30% of its packets")
            }
            FaultKind::LeaderKill => {
                let l = leader.expect("looked up above");
                self.cluster.kill(l);
                self.killed.push(l);
                format!("leader {l} SIGKILLed")
            }
            FaultKind::LeaderPause => {
                let l = leader.expect("looked up above");
                self.cluster.signal(l, "STOP");
                self.stopped.push(l);
                format!("leader {l} SIGSTOPped")
            }
            FaultKind::ClientPause => {
                let pids = self.holders.pids();
                let pid = pids[(step.pick % pids.len() as u64) as usize];
                self.holders.signal(pid, "STOP");
                self.paused_holder = Some(pid);
                format!("lock holder pid {pid} SIGSTOPped")
            }
            FaultKind::LogAppendCrash => {
                let target = match self.leader().await {
                    // The leader appends every write; a follower only
                    // what it is sent. Either may be picked.
                    Some(l) if step.pick.is_multiple_of(2) => l,
                    _ => any,
                };
                arm_fail_point(self.cluster, target, LOG_APPEND_FAIL_POINT, "return").await?;
                self.killed.push(target);
                format!("member {target} crashes at its next log append, before the fsync")
            }
            FaultKind::CommitCrash => {
                let l = leader.expect("looked up above");
                arm_fail_point(self.cluster, l, COMMIT_FAIL_POINT, "1*return").await?;
                self.killed.push(l);
                format!("leader {l} crashes after its next commit, before answering")
            }
            FaultKind::CellRestart => {
                for id in &ids {
                    self.cluster.kill(*id);
                }
                self.killed.extend(&ids);
                "every member SIGKILLed".to_string()
            }
        };
        Ok(Injected {
            kind: step.kind,
            detail,
        })
    }

    /// Undoes every fault in place: rules removed, members and holders
    /// continued, killed or crashed members restarted on their data.
    pub async fn heal(&mut self) {
        self.net.heal();
        for id in self.stopped.drain(..) {
            self.cluster.signal(id, "CONT");
        }
        if let Some(pid) = self.paused_holder.take() {
            self.holders.signal(pid, "CONT");
        }
        for id in std::mem::take(&mut self.killed) {
            // A member armed to crash may not have appended anything yet:
            // it is restarted all the same, which disarms the fail point.
            self.cluster.kill(id);
            self.cluster.spawn(id);
        }
    }
}

/// Arms fail point `name` with `actions` (the `fail` crate's syntax) on
/// member `id`; only a debug build started with `--unsafe-fail-points`
/// serves them.
pub async fn arm_fail_point(
    cluster: &Cluster,
    id: u64,
    name: &str,
    actions: &str,
) -> Result<(), String> {
    let addr = &cluster.member(id).metrics;
    let path = format!("/debug/fail-points/{name}");
    match http_request(addr, "PUT", &path, actions).await {
        Some(r) if r.starts_with("HTTP/1.1 200") => Ok(()),
        Some(r) => Err(format!(
            "member {id} refused fail point {name}: {} (is it a debug build started with --unsafe-fail-points?)",
            r.lines().next().unwrap_or_default()
        )),
        None => Err(format!("member {id} did not answer at {addr}")),
    }
}

/// Whether the members serve fail points (a debug build started with
/// `--unsafe-fail-points`).
pub async fn has_fail_points(cluster: &Cluster, id: u64) -> bool {
    let addr = &cluster.member(id).metrics;
    matches!(
        tokio::time::timeout(
            Duration::from_secs(3),
            http_request(addr, "GET", "/debug/fail-points", "")
        )
        .await,
        Ok(Some(r)) if r.starts_with("HTTP/1.1 200")
    )
}
