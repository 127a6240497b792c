//! Forwarding to the leader: where it is, and one attempt to reach it.
//!
//! Channels are made once per peer address and reused (a tonic channel
//! reconnects by itself). Each failed attempt is classified by what it
//! proves: refused before anything was sent is safe to resend; broken after
//! sending means the request may have been served, and only an idempotent
//! request may then be sent again (see `Forward::is_idempotent`).

use super::protocol::{Forward, ForwardReply};
use crate::raft::network::PeerChannels;
use crate::raft::{NodeId, Raft};
use crate::storage::codec;
use latchkey_shared::peer::peer_client::PeerClient;
use latchkey_shared::ApiError;
use std::future::Future;
use std::time::Duration;
use tokio::time::Instant;
use tonic::transport::Channel;

/// Forwarding over the member's peer channels (the ones Raft uses too).
#[derive(Clone, Default)]
pub struct PeerClients {
    channels: PeerChannels,
}

impl PeerClients {
    pub fn new(channels: PeerChannels) -> Self {
        PeerClients { channels }
    }

    fn get(&self, addr: &str) -> Result<PeerClient<Channel>, ApiError> {
        self.channels
            .get(addr)
            .map_err(|e| ApiError::internal(format!("bad peer address {addr}: {e}")))
    }

    /// Sends `req` to the member at `addr` once. A failure in transport is
    /// `not_leader` when the request never left this member (so the caller
    /// may look for the leader again and resend), and
    /// `write_outcome_unknown` when it may have arrived.
    pub async fn send(
        &self,
        addr: &str,
        req: &Forward,
        deadline: Instant,
    ) -> Result<ForwardReply, ApiError> {
        let data = codec::encode(req).map_err(|e| ApiError::internal(e.to_string()))?;
        let mut client = self.get(addr)?;
        let timeout = deadline.saturating_duration_since(Instant::now());
        match client.forward(self.channels.request(data, timeout)).await {
            Ok(resp) => codec::decode::<Result<ForwardReply, ApiError>>(&resp.into_inner().data)
                .map_err(|e| {
                    ApiError::write_outcome_unknown(format!("undecodable reply from {addr}: {e}"))
                })?,
            Err(status) => Err(latchkey_shared::error::classify_call_failure(&status)),
        }
    }
}

/// Sends `req` to `leader` at `addr` once (as [`PeerClients::send`]), and
/// gives up soon after this member no longer names `leader` as leader: a
/// leader cut off or paused never answers, and waiting out the request
/// timeout for it would stall every request forwarded meanwhile long after
/// a new leader took over. The outcome is then unknown (the old leader
/// may have committed it before it went), as etcd's "leader changed".
pub async fn send_to_leader(
    raft: &Raft,
    peers: &PeerClients,
    (leader, addr): (NodeId, &str),
    req: &Forward,
    deadline: Instant,
) -> Result<ForwardReply, ApiError> {
    answer_unless_gone(
        peers.send(addr, req, deadline),
        leader_gone(raft, leader),
        leader,
    )
    .await
}

/// How long a send still may report its own outcome once its leader is
/// gone. A dead leader's port refuses the connection at once, which proves
/// the request never left; without this moment, an election that starts
/// while such an attempt is under way turned a write that was never sent
/// into one of unknown outcome, answered before the request timeout (seen
/// in CI: `t30_failover::without_a_quorum_…`, 933 ms into a 1.5 s timeout).
const OWN_VERDICT_GRACE: Duration = Duration::from_millis(100);

/// `send`'s answer; once `gone` resolves, whatever `send` reports within
/// [`OWN_VERDICT_GRACE`], else an unknown outcome.
async fn answer_unless_gone(
    send: impl Future<Output = Result<ForwardReply, ApiError>>,
    gone: impl Future<Output = ()>,
    leader: NodeId,
) -> Result<ForwardReply, ApiError> {
    tokio::pin!(send);
    tokio::select! {
        biased;
        reply = &mut send => return reply,
        () = gone => {}
    }
    match tokio::time::timeout(OWN_VERDICT_GRACE, send).await {
        Ok(reply) => reply,
        Err(_) => Err(ApiError::write_outcome_unknown(format!(
            "the leader changed while the request was with member {leader}"
        ))),
    }
}

/// Resolves once this member's Raft no longer names `leader` as leader (a
/// new one was elected, or an election is under way).
async fn leader_gone(raft: &Raft, leader: NodeId) {
    let mut rx = raft.metrics();
    loop {
        if rx.borrow_and_update().current_leader != Some(leader) {
            return;
        }
        if rx.changed().await.is_err() {
            // Raft stopped: the request's own deadline ends the wait.
            std::future::pending::<()>().await;
        }
    }
}

/// The current leader and its peer address, waiting for one to be elected
/// until `deadline`.
pub async fn leader(raft: &Raft, deadline: Instant) -> Result<(NodeId, String), ApiError> {
    let mut rx = raft.metrics();
    loop {
        {
            let m = rx.borrow_and_update();
            if let Some(leader) = m.current_leader {
                if let Some(node) = m.membership_config.membership().get_node(&leader) {
                    return Ok((leader, node.peer_addr.clone()));
                }
            }
        }
        match tokio::time::timeout_at(deadline, rx.changed()).await {
            Ok(Ok(())) => continue,
            Ok(Err(_)) => return Err(crate::raft::errors::fatal("metrics closed")),
            Err(_) => return Err(ApiError::no_leader()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::raft::command::Request;
    use latchkey_shared::etcdpb::PbPutRequest;
    use latchkey_shared::Retry;
    use tokio::io::AsyncReadExt;
    use tokio::net::TcpListener;

    fn a_write() -> Forward {
        Forward::Write(Request::Put(PbPutRequest {
            key: b"k".to_vec(),
            value: b"v".to_vec(),
            ..Default::default()
        }))
    }

    /// A "leader" that accepts one connection, reads all the client sends
    /// (until it has been quiet for a moment: the whole request has
    /// arrived), and closes it without answering.
    async fn closes_after_reading() -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        tokio::spawn(async move {
            let Ok((mut socket, _)) = listener.accept().await else {
                return;
            };
            let mut buf = [0u8; 4096];
            while let Ok(Ok(n)) =
                tokio::time::timeout(Duration::from_millis(300), socket.read(&mut buf)).await
            {
                if n == 0 {
                    break;
                }
            }
        });
        addr
    }

    async fn send_once(addr: &str, req: &Forward) -> ApiError {
        let peers = PeerClients::default();
        let deadline = Instant::now() + Duration::from_secs(5);
        tokio::time::timeout(Duration::from_secs(10), peers.send(addr, req, deadline))
            .await
            .expect("bounded")
            .expect_err("nothing answers")
    }

    #[tokio::test]
    async fn a_refused_connection_is_safe_to_send_again() {
        let addr = {
            let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
            l.local_addr().expect("addr").to_string()
        };
        let e = send_once(&addr, &a_write()).await;
        assert_eq!(e.retry(), Retry::Safe, "{e}");
        assert!(Forward::ReadIndex.is_idempotent());
    }

    #[tokio::test]
    async fn a_write_whose_connection_broke_after_sending_has_an_unknown_outcome() {
        let addr = closes_after_reading().await;
        let e = send_once(&addr, &a_write()).await;
        assert_eq!(
            e.code,
            latchkey_shared::ErrorCode::WriteOutcomeUnknown,
            "{e}"
        );
        assert_eq!(e.retry(), Retry::OutcomeUnknown);
        assert!(!a_write().is_idempotent(), "a write is never sent twice");
    }

    /// The race CI met: the election starts while an attempt to reach the
    /// dead leader is under way. The refusal that follows proves the write
    /// never left, so it may be sent again; only a send that stays silent
    /// past the grace has an unknown outcome.
    #[tokio::test(start_paused = true)]
    async fn a_send_refused_just_after_its_leader_is_gone_is_safe_to_send_again() {
        let refused = async {
            tokio::time::sleep(Duration::from_millis(5)).await;
            Err(ApiError::unavailable("the request was not sent: refused"))
        };
        let e = answer_unless_gone(refused, std::future::ready(()), 1)
            .await
            .expect_err("refused");
        assert_eq!(e.retry(), Retry::Safe, "{e}");

        let silent = std::future::pending();
        let started = Instant::now();
        let e = answer_unless_gone(silent, std::future::ready(()), 1)
            .await
            .expect_err("silent");
        assert_eq!(e.retry(), Retry::OutcomeUnknown, "{e}");
        assert_eq!(started.elapsed(), OWN_VERDICT_GRACE);
    }
}
