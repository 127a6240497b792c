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
/// gives up as soon as this member no longer names `leader` as leader: a
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
    tokio::select! {
        biased;
        reply = peers.send(addr, req, deadline) => reply,
        () = leader_gone(raft, leader) => Err(ApiError::write_outcome_unknown(format!(
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
    use std::time::Duration;
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
}
