//! Membership changes (etcd's Cluster service) and leader transfer,
//! carried out on the leader through openraft's joint consensus.
//!
//! A member is added before its process starts (as in etcd): as a learner
//! it only receives the log; as a voter the quorum grows at once. A node
//! started with `--join` finds its own id by its peer address in the member
//! list and waits for the leader to replicate to it.

use crate::peer::client::PeerClients;
use crate::peer::protocol::{Forward, ForwardReply, MembershipChange};
use crate::raft::leadership::SitOutElections;
use crate::raft::{errors, Member, NodeId, Raft};
use latchkey_shared::{ApiError, ErrorCode};
use openraft::ChangeMembers;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;
use tokio::time::Instant;

/// A learner may be promoted when it is at most this many entries (or a
/// tenth of the log, if more) behind the leader, like etcd's 90% rule.
const PROMOTE_MAX_LAG: u64 = 100;

/// Reads one peer URL ("http://host:port", "https://host:port" or plain
/// "host:port") as the address peers dial. The scheme says nothing to the
/// cell: whether peers speak TLS is the members' flags' business.
pub fn parse_peer_urls(urls: &[String]) -> Result<String, ApiError> {
    let bad = |why: &str| ApiError::new(ErrorCode::MemberBadUrls, why.to_string());
    let [url] = urls else {
        return Err(bad("exactly one peer URL is supported per member"));
    };
    let addr = without_scheme(url);
    match addr.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => {
            Ok(addr.to_string())
        }
        _ => Err(bad(
            "a peer URL must be http://host:port or https://host:port",
        )),
    }
}

/// How long a voter may take to answer the probe that counts the voters
/// up before a change of voters.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// etcd's strict reconfiguration check: refuses a change after which the
/// voters known to be up (`up`) would not be a quorum of `new_voters`.
/// Without it, adding a voter that never starts while another is down, or
/// removing a healthy voter while another is down, stalls the cell until
/// the missing member comes back (cell review A5).
fn check_quorum_after(
    new_voters: &BTreeSet<NodeId>,
    up: &BTreeSet<NodeId>,
) -> Result<(), ApiError> {
    let up_after = new_voters.intersection(up).count();
    if up_after * 2 > new_voters.len() {
        return Ok(());
    }
    Err(ApiError::not_enough_started_members(format!(
        "after this change {up_after} of {} voters would be up, not a quorum; start the \
         missing members first, or add the new member as a learner (`member add --learner`) \
         and promote it once it has caught up",
        new_voters.len()
    )))
}

/// What membership changes need of the member that leads.
pub struct Membership<'a> {
    pub id: NodeId,
    pub raft: &'a Raft,
    pub peers: &'a PeerClients,
    pub request_timeout: Duration,
    pub election_timeout: Duration,
}

impl Membership<'_> {
    /// The members among `ids` that answer a peer request now, this member
    /// (the leader) included; one not in the membership yet is not up.
    async fn members_up(&self, ids: &BTreeSet<NodeId>) -> BTreeSet<NodeId> {
        let m = self.raft.metrics().borrow().clone();
        let membership = m.membership_config.membership();
        let others: Vec<(NodeId, String)> = ids
            .iter()
            .copied()
            .filter(|id| *id != self.id)
            .filter_map(|id| membership.get_node(&id).map(|n| (id, n.peer_addr.clone())))
            .collect();
        let deadline = Instant::now() + PROBE_TIMEOUT;
        let probes = others.into_iter().map(|(id, addr)| async move {
            let answer = self
                .peers
                .send(&addr, &Forward::CommittedMembership, deadline)
                .await;
            answer.is_ok().then_some(id)
        });
        let mut up: BTreeSet<NodeId> = futures::future::join_all(probes)
            .await
            .into_iter()
            .flatten()
            .collect();
        up.insert(self.id);
        up
    }

    /// Refuses a change of voters to `new_voters` that the members up now
    /// could not commit (see [`check_quorum_after`]).
    async fn check_voters_change(&self, new_voters: BTreeSet<NodeId>) -> Result<(), ApiError> {
        let up = self.members_up(&new_voters).await;
        check_quorum_after(&new_voters, &up)
    }

    /// Carries out `change` on this member, which must lead. Returns once the
    /// final configuration is committed, or fails at the request timeout (the
    /// change may still complete).
    pub async fn change(&self, change: &MembershipChange) -> Result<(), ApiError> {
        let m = self.raft.metrics().borrow().clone();
        let membership = m.membership_config.membership();
        let node_addr = |id: NodeId| membership.get_node(&id).map(|n| n.peer_addr.clone());
        let is_voter = |id: NodeId| membership.voter_ids().any(|v| v == id);
        let addr_taken = |addr: &str, except: NodeId| {
            membership
                .nodes()
                .any(|(id, n)| *id != except && n.peer_addr == addr)
        };
        let raft = self.raft;
        let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
        let with = |id: NodeId| voters.iter().copied().chain([id]).collect();
        let without = |id: NodeId| voters.iter().copied().filter(|v| *v != id).collect();
        let work = async {
            match change {
                MembershipChange::Add {
                    id,
                    peer_addr,
                    learner,
                } => {
                    if node_addr(*id).is_some() {
                        return Err(ApiError::etcd(ErrorCode::MemberExists));
                    }
                    if addr_taken(peer_addr, 0) {
                        return Err(ApiError::etcd(ErrorCode::PeerUrlExists));
                    }
                    let member = Member {
                        peer_addr: peer_addr.clone(),
                    };
                    if *learner {
                        raft.add_learner(*id, member, false).await
                    } else {
                        self.check_voters_change(with(*id)).await?;
                        let nodes = BTreeMap::from([(*id, member)]);
                        raft.change_membership(ChangeMembers::AddVoters(nodes), false)
                            .await
                    }
                }
                MembershipChange::Promote { id } => {
                    if node_addr(*id).is_none() {
                        return Err(ApiError::etcd(ErrorCode::MemberNotFound));
                    }
                    if is_voter(*id) {
                        return Err(ApiError::etcd(ErrorCode::MemberNotLearner));
                    }
                    let last = m.last_log_index.unwrap_or(0);
                    let matched = m
                        .replication
                        .as_ref()
                        .and_then(|r| r.get(id).copied().flatten())
                        .map_or(0, |l| l.index);
                    if matched + PROMOTE_MAX_LAG.max(last / 10) < last {
                        return Err(ApiError::etcd(ErrorCode::LearnerNotReady));
                    }
                    self.check_voters_change(with(*id)).await?;
                    raft.change_membership(ChangeMembers::AddVoterIds(BTreeSet::from([*id])), false)
                        .await
                }
                MembershipChange::Remove { id } => {
                    if node_addr(*id).is_none() {
                        return Err(ApiError::etcd(ErrorCode::MemberNotFound));
                    }
                    let ids = BTreeSet::from([*id]);
                    if is_voter(*id) {
                        self.check_voters_change(without(*id)).await?;
                        raft.change_membership(ChangeMembers::RemoveVoters(ids), false)
                            .await
                    } else {
                        raft.change_membership(ChangeMembers::RemoveNodes(ids), false)
                            .await
                    }
                }
                MembershipChange::Update { id, peer_addr } => {
                    if node_addr(*id).is_none() {
                        return Err(ApiError::etcd(ErrorCode::MemberNotFound));
                    }
                    if addr_taken(peer_addr, *id) {
                        return Err(ApiError::etcd(ErrorCode::PeerUrlExists));
                    }
                    let nodes = BTreeMap::from([(
                        *id,
                        Member {
                            peer_addr: peer_addr.clone(),
                        },
                    )]);
                    raft.change_membership(ChangeMembers::SetNodes(nodes), false)
                        .await
                }
            }
            .map(|_| ())
            .map_err(errors::client_write)
        };
        match tokio::time::timeout(self.request_timeout, work).await {
            Ok(result) => {
                if result.is_ok() {
                    tracing::info!(?change, "membership changed");
                }
                result
            }
            Err(_) => Err(ApiError::new(
                ErrorCode::Timeout,
                "the membership change did not commit in time; check MemberList",
            )),
        }
    }

    /// Hands leadership to voter `target`: waits until it has the whole log,
    /// asks it to campaign, and waits until it leads. openraft 0.9 has no
    /// leader transfer; a caught-up candidate with a higher term wins because
    /// the old leader steps down when it sees that term.
    pub async fn move_leader(&self, target: NodeId) -> Result<(), ApiError> {
        if target == self.id {
            return Ok(());
        }
        let deadline = Instant::now() + self.request_timeout;
        let addr = {
            let m = self.raft.metrics().borrow().clone();
            let membership = m.membership_config.membership();
            if !membership.voter_ids().any(|v| v == target) {
                return Err(ApiError::bad_leader_transferee());
            }
            membership
                .get_node(&target)
                .map(|n| n.peer_addr.clone())
                .ok_or_else(|| ApiError::etcd(ErrorCode::MemberNotFound))?
        };
        // Wait until the target holds everything this leader has.
        loop {
            let caught_up = {
                let m = self.raft.metrics();
                let m = m.borrow();
                let matched = m
                    .replication
                    .as_ref()
                    .and_then(|r| r.get(&target).copied().flatten())
                    .map(|l| l.index);
                matched >= m.last_log_index
            };
            if caught_up {
                break;
            }
            if Instant::now() >= deadline {
                return Err(ApiError::new(
                    ErrorCode::Timeout,
                    "the transferee did not catch up with the leader in time",
                ));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // The old leader steps down when it sees the target's higher term, but
        // it would then compete in the election (and often win, as the third
        // member still holds its lease). It sits this election out.
        let _sit_out = SitOutElections::new(self.raft);
        let retry = self.election_timeout;
        loop {
            self.peers.send(&addr, &Forward::Campaign, deadline).await?;
            let until = (Instant::now() + retry).min(deadline);
            while Instant::now() < until {
                if self.raft.metrics().borrow().current_leader == Some(target) {
                    tracing::info!(target, "leadership moved");
                    return Ok(());
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            if Instant::now() >= deadline {
                return Err(ApiError::leader_transfer_timeout());
            }
        }
    }
}

/// How often a member that hears from no leader asks its peers whether it
/// is still a member: a few election timeouts, so an election in progress
/// settles first.
const REMOVAL_CHECK: Duration = Duration::from_secs(2);
/// How long one peer may take to answer that question.
const REMOVAL_QUERY_TIMEOUT: Duration = Duration::from_secs(1);

impl Membership<'_> {
    /// What this member has committed of the membership: for
    /// `Forward::CommittedMembership`.
    pub fn committed(&self) -> ForwardReply {
        let m = self.raft.metrics().borrow().clone();
        let applied = m.last_applied.map(|l| l.index);
        let config = &m.membership_config;
        // Only an applied configuration is known to be committed.
        let (index, members) = if config.log_id().map(|l| l.index) <= applied {
            (
                config.log_id().map(|l| l.index),
                config.membership().nodes().map(|(id, _)| *id).collect(),
            )
        } else {
            (None, Vec::new())
        };
        ForwardReply::Membership { index, members }
    }

    /// Resolves when a peer has committed a membership newer than this
    /// member's that does not include it. A removed follower never learns
    /// of its removal from Raft (the leader stops replicating to it), so
    /// while it hears from no leader it asks its peers (cell review A6).
    pub async fn removed_elsewhere(&self) {
        loop {
            tokio::time::sleep(REMOVAL_CHECK).await;
            let m = self.raft.metrics().borrow().clone();
            if m.current_leader.is_some() {
                continue;
            }
            let mine = m.membership_config.log_id().map(|l| l.index);
            let peers: Vec<String> = m
                .membership_config
                .membership()
                .nodes()
                .filter(|(id, _)| **id != self.id)
                .map(|(_, n)| n.peer_addr.clone())
                .collect();
            for addr in peers {
                let deadline = Instant::now() + REMOVAL_QUERY_TIMEOUT;
                let answer = self
                    .peers
                    .send(&addr, &Forward::CommittedMembership, deadline)
                    .await;
                if let Ok(ForwardReply::Membership {
                    index: Some(index),
                    members,
                }) = answer
                {
                    if Some(index) > mine && !members.contains(&self.id) {
                        tracing::warn!(
                            peer = %addr,
                            index,
                            "a peer committed a membership without this member"
                        );
                        return;
                    }
                }
            }
        }
    }
}

/// `host:port` of an `http://` or `https://` URL (or of `host:port`).
fn without_scheme(url: &str) -> &str {
    url.strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
        .unwrap_or(url)
        .trim_end_matches('/')
}

/// For `--join`: asks the running cell (any of `urls`, over TLS with `tls`
/// for `https://` ones) which id MemberAdd gave `peer_addr`, and the
/// cell's id. Retries until `timeout`, since the member may be added just
/// after this process starts.
pub async fn discover_identity(
    urls: &[String],
    peer_addr: &str,
    tls: Option<etcd_client::TlsOptions>,
    timeout: Duration,
) -> anyhow::Result<(NodeId, u64)> {
    let deadline = Instant::now() + timeout;
    let want = format!("http://{peer_addr}");
    let listed = |url: &String| without_scheme(url) == peer_addr;
    let mut last_error;
    loop {
        let attempt = async {
            let mut options = etcd_client::ConnectOptions::new()
                .with_connect_timeout(Duration::from_secs(2))
                .with_timeout(Duration::from_secs(3));
            if let Some(tls) = tls.clone() {
                options = options.with_tls(tls);
            }
            let mut client = etcd_client::Client::connect(urls, Some(options)).await?;
            let list = client.member_list().await?;
            let cluster_id = list.header().map_or(0, |h| h.cluster_id());
            let id = list
                .members()
                .iter()
                .find(|m| m.peer_urls().iter().any(listed))
                .map(|m| m.id());
            Ok::<_, etcd_client::Error>((id, cluster_id))
        };
        last_error = match attempt.await {
            Ok((Some(id), cluster_id)) => return Ok((id, cluster_id)),
            Ok((None, _)) => format!(
                "the cell has no member with peer URL {want}; add it first with \
                 `etcdctl member add NAME --peer-urls={want}`"
            ),
            Err(e) => format!("cannot reach the cell at {urls:?}: {e}"),
        };
        if Instant::now() >= deadline {
            anyhow::bail!("--join: {last_error}");
        }
        tracing::info!(reason = %last_error, "waiting to join");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A5 (cell review): a change of voters the members up cannot commit
    /// stalled the cell for good.
    #[test]
    fn a5_a_change_that_leaves_the_voters_up_short_of_a_quorum_is_refused() {
        let set = |ids: &[NodeId]| ids.iter().copied().collect::<BTreeSet<_>>();
        // Three voters, one down: adding a fourth needs 3 of 4 up.
        let err = check_quorum_after(&set(&[1, 2, 3, 4]), &set(&[1, 2])).unwrap_err();
        assert_eq!(err.code, ErrorCode::NotEnoughStartedMembers);
        assert!(err.message.contains("--learner"), "{}", err.message);
        // ...and removing the other healthy voter leaves 1 of 2.
        assert!(check_quorum_after(&set(&[1, 3]), &set(&[1, 2])).is_err());
        // A one-member cell adding a voter that has not started: 1 of 2.
        assert!(check_quorum_after(&set(&[1, 2]), &set(&[1])).is_err());
        // Fine: all up, or removing the member that is down.
        assert!(check_quorum_after(&set(&[1, 2, 3, 4]), &set(&[1, 2, 3])).is_ok());
        assert!(check_quorum_after(&set(&[1, 2]), &set(&[1, 2])).is_ok());
        assert!(check_quorum_after(&set(&[1, 2, 4]), &set(&[1, 2, 4])).is_ok());
    }

    #[test]
    fn peer_urls_must_be_one_http_or_https_address() {
        let one = |u: &str| parse_peer_urls(&[u.to_string()]);
        assert_eq!(
            one("http://127.0.0.1:7904").ok().as_deref(),
            Some("127.0.0.1:7904")
        );
        assert_eq!(one("10.0.0.1:2380").ok().as_deref(), Some("10.0.0.1:2380"));
        assert_eq!(one("https://h:1").ok().as_deref(), Some("h:1"));
        assert_eq!(
            one("http://nohost").unwrap_err().code,
            ErrorCode::MemberBadUrls
        );
        assert_eq!(
            one("http://h:99999").unwrap_err().code,
            ErrorCode::MemberBadUrls
        );
        assert!(parse_peer_urls(&[]).is_err());
        assert!(parse_peer_urls(&["http://a:1".into(), "http://b:2".into()]).is_err());
    }
}
