//! A network partition on one host: iptables rules that drop a member's
//! peer traffic while it keeps serving clients. Needs root and iptables,
//! and a cluster whose members have their own loopback addresses
//! ([`Cluster::start_apart`]): on one shared address no rule could tell
//! one member's connections from another's.

use crate::cluster::Cluster;
use std::process::Command;

/// What every rule of this process carries, so a crashed test's rules can
/// be found and removed by hand (`iptables -S INPUT | grep latchkey`).
fn tag() -> String {
    format!("latchkey-testkit-{}", std::process::id())
}

/// Packets dropped between members' addresses, any port: a partition of
/// any shape (symmetric, one-way, lossy). Each member must have its own
/// loopback address ([`Cluster::start_apart`]); clients on 127.0.0.1 are
/// never affected. Removed on [`NetFaults::heal`] and on drop.
#[derive(Default)]
pub struct NetFaults {
    rules: Vec<Vec<String>>,
}

impl NetFaults {
    pub fn new() -> NetFaults {
        NetFaults::default()
    }

    /// Drops packets from `from` to `to` (IP addresses), each with
    /// probability `loss` (1.0: all). TCP needs both directions, so a
    /// one-way cut stops connections opened either way, but differently:
    /// `to`'s connections to `from` get their requests through and lose
    /// the answers, as in Jepsen's one-way partitions.
    pub fn drop(&mut self, from: &str, to: &str, loss: f64) -> Result<(), String> {
        let mut r: Vec<String> = ["INPUT", "-s", from, "-d", to]
            .iter()
            .map(|s| s.to_string())
            .collect();
        if loss < 1.0 {
            r.extend(
                ["-m", "statistic", "--mode", "random", "--probability"]
                    .iter()
                    .map(|s| s.to_string()),
            );
            r.push(format!("{loss:.3}"));
        }
        r.extend(["-m".into(), "comment".into(), "--comment".into(), tag()]);
        r.extend(["-j".into(), "DROP".into()]);
        iptables("-I", &r)?;
        self.rules.push(r);
        Ok(())
    }

    /// Cuts every address of `side` off from every address of `other`,
    /// both ways.
    pub fn split(&mut self, side: &[String], other: &[String]) -> Result<(), String> {
        for a in side {
            for b in other {
                self.drop(a, b, 1.0)?;
                self.drop(b, a, 1.0)?;
            }
        }
        Ok(())
    }

    /// Whether any rule is in place.
    pub fn active(&self) -> bool {
        !self.rules.is_empty()
    }

    /// Removes every rule: the network heals.
    pub fn heal(&mut self) {
        for r in self.rules.drain(..) {
            if let Err(e) = iptables("-D", &r) {
                eprintln!("could not remove a partition rule: {e}");
            }
        }
    }
}

impl Drop for NetFaults {
    fn drop(&mut self) {
        self.heal();
    }
}

fn iptables(action: &str, rule: &[String]) -> Result<(), String> {
    let out = Command::new("iptables")
        .arg(action)
        .args(rule)
        .output()
        .map_err(|e| format!("iptables cannot run ({e}); scripts/install-deps.sh installs it"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "iptables {action} {}: {} (partitions need root)",
            rule.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn ip_of(addr: &str) -> String {
    addr.rsplit_once(':').map_or(addr, |(ip, _)| ip).to_string()
}

/// One member cut off from its peers, both ways, while it keeps serving
/// clients (on 127.0.0.1, never cut): [`NetFaults`] between its address
/// and theirs. Removed on drop.
pub struct PeerBlackhole(NetFaults);

impl PeerBlackhole {
    /// Drops every packet between member `id` and each of its peers (no
    /// reset, as when a network drops them).
    pub fn cut(cluster: &Cluster, id: u64) -> PeerBlackhole {
        let own = ip_of(&cluster.member(id).peer);
        let others: Vec<String> = cluster
            .members
            .iter()
            .filter(|m| m.id != id)
            .map(|m| ip_of(&m.peer))
            .collect();
        assert!(
            !others.contains(&own),
            "members share an address: use Cluster::start_apart"
        );
        let mut faults = NetFaults::new();
        faults
            .split(std::slice::from_ref(&own), &others)
            .unwrap_or_else(|e| panic!("{e}"));
        PeerBlackhole(faults)
    }

    /// Removes the rules: the partition heals.
    pub fn heal(mut self) {
        self.0.heal();
    }
}
