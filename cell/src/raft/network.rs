//! The client side of cell-to-cell RPCs: openraft's `RaftNetwork` over the
//! tonic `Peer` service, plus forwarding of client requests to the leader.
//! Snapshots go as openraft's chunked `InstallSnapshot` (its default
//! `full_snapshot`), each chunk with its own timeout and retries.
//!
//! Each payload is a bincode-encoded openraft request; each reply is an
//! encoded `Result` carrying openraft's own error, so a remote Raft error
//! reaches openraft unchanged.

use super::election_nudge::ElectionNudge;
use super::{Member, NodeId, TypeConfig};
use crate::storage::codec::{decode, encode};
use dashmap::DashMap;
use latchkey_shared::peer::peer_client::PeerClient;
use latchkey_shared::peer::Payload;
use latchkey_shared::tls::client::lazy_channel;
use latchkey_shared::tls::ClientTls;
use openraft::error::{
    InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use serde::de::DeserializeOwned;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;
use tonic::transport::{Channel, Endpoint};

/// The largest peer message: a replication batch, or a forwarded request
/// and its reply (a txn's ranges may be large). Snapshots never come whole:
/// openraft sends them in chunks of [`SNAPSHOT_CHUNK_BYTES`] (cell review
/// A3: a snapshot over this cap could never be sent).
pub const MAX_PEER_MESSAGE_BYTES: usize = 1024 * 1024 * 1024;

/// How much of a snapshot one `InstallSnapshot` message carries.
pub const SNAPSHOT_CHUNK_BYTES: u64 = 4 * 1024 * 1024;

/// HTTP/2 flow-control windows of peer connections: a stream may have this
/// much in flight (a replication batch of 32 entries of up to 1.5 MiB fits
/// in a round trip or two), the connection as a whole four times that.
pub const PEER_STREAM_WINDOW: u32 = 16 * 1024 * 1024;
pub const PEER_CONNECTION_WINDOW: u32 = 64 * 1024 * 1024;

/// A lazily connecting channel to a peer address, dialled from `local`
/// when given, over TLS with `tls` when given (the peer's certificate must
/// name the host of `addr`).
pub fn peer_channel(
    addr: &str,
    local: Option<IpAddr>,
    tls: Option<&ClientTls>,
) -> Result<Channel, tonic::transport::Error> {
    let endpoint = Endpoint::from_shared(format!("http://{addr}"))?
        // A peer that does not answer a connect within this is down for
        // replication purposes; openraft backs off and retries.
        .connect_timeout(Duration::from_millis(500))
        .tcp_nodelay(true)
        .http2_keep_alive_interval(Duration::from_secs(5))
        .keep_alive_timeout(Duration::from_secs(5))
        // One connection per peer carries replication, heartbeats, votes
        // and forwarded requests at once. HTTP/2's default 64 KiB windows
        // would let one large AppendEntries hold the heartbeats behind it
        // for many round trips; these let a batch through in one.
        .initial_stream_window_size(PEER_STREAM_WINDOW)
        .initial_connection_window_size(PEER_CONNECTION_WINDOW);
    Ok(lazy_channel(&endpoint, tls, local))
}

pub fn peer_client(channel: Channel) -> PeerClient<Channel> {
    PeerClient::new(channel)
        .max_decoding_message_size(MAX_PEER_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_PEER_MESSAGE_BYTES)
}

/// The metadata every peer request carries: the id of the cell it is for.
/// A member refuses requests for another cell, as etcd refuses a peer
/// message with another `X-Etcd-Cluster-ID`: members started with different
/// `--initial-cluster` lists or `--restore` files never mix their logs.
pub const CLUSTER_ID_HEADER: &str = "latchkey-cluster-id";

/// One client per peer address, made on first use and shared by Raft's
/// replication and votes and by forwarded requests. openraft asks the
/// factory for a client at every replication (re)start and every read-index
/// round; a channel made each time would open a TCP connection each time
/// (cell review A4). A tonic channel reconnects by itself, so one per peer
/// is enough.
#[derive(Clone, Default)]
pub struct PeerChannels {
    clients: Arc<DashMap<String, PeerClient<Channel>>>,
    /// [`CLUSTER_ID_HEADER`]'s value, made once (every AppendEntries
    /// carries it).
    cluster_id: Option<tonic::metadata::AsciiMetadataValue>,
    /// The address peers are dialled from: this member's own peer address
    /// (when it is a specific one), so a peer sees who is calling and a
    /// firewall rule can tell members apart even on one host.
    local: Option<IpAddr>,
    /// Mutual TLS with the peers (`--peer-cert-file`), or plain text.
    tls: Option<ClientTls>,
}

impl PeerChannels {
    /// Channels for the peers of cell `cluster_id`, dialled from the IP of
    /// `own_peer_addr` unless it is unspecified (`0.0.0.0`, `::`).
    pub fn new(cluster_id: u64, own_peer_addr: SocketAddr, tls: Option<ClientTls>) -> Self {
        let ip = own_peer_addr.ip();
        PeerChannels {
            clients: Default::default(),
            cluster_id: format!("{cluster_id:x}").parse().ok(),
            local: (!ip.is_unspecified()).then_some(ip),
            tls,
        }
    }

    /// A peer request carrying `data`, stamped with this cell's id.
    pub fn request(&self, data: Vec<u8>, timeout: Duration) -> tonic::Request<Payload> {
        let mut request = tonic::Request::new(Payload { data });
        request.set_timeout(timeout);
        if let Some(id) = &self.cluster_id {
            request.metadata_mut().insert(CLUSTER_ID_HEADER, id.clone());
        }
        request
    }

    /// The client for `addr`; fails only for an address that is not one.
    pub fn get(&self, addr: &str) -> Result<PeerClient<Channel>, tonic::transport::Error> {
        if let Some(c) = self.clients.get(addr) {
            return Ok(c.clone());
        }
        let client = peer_client(peer_channel(addr, self.local, self.tls.as_ref())?);
        Ok(self
            .clients
            .entry(addr.to_string())
            .or_insert(client)
            .clone())
    }

    /// A client on a new connection to `addr`, shared from now on in place
    /// of the one before (whose connection stays with whoever still holds
    /// it, and closes when they let it go).
    pub fn reconnect(&self, addr: &str) -> Result<PeerClient<Channel>, tonic::transport::Error> {
        let client = peer_client(peer_channel(addr, self.local, self.tls.as_ref())?);
        self.clients.insert(addr.to_string(), client.clone());
        Ok(client)
    }

    /// How many peers have a client.
    pub fn len(&self) -> usize {
        self.clients.len()
    }

    pub fn is_empty(&self) -> bool {
        self.clients.is_empty()
    }
}

#[derive(Clone, Default)]
pub struct NetworkFactory {
    pub channels: PeerChannels,
    pub nudge: ElectionNudge,
}

pub struct PeerConnection {
    target: NodeId,
    nudge: ElectionNudge,
    client: Option<PeerClient<Channel>>,
    channels: PeerChannels,
    addr: String,
}

impl RaftNetworkFactory<TypeConfig> for NetworkFactory {
    type Network = PeerConnection;

    async fn new_client(&mut self, target: NodeId, node: &Member) -> Self::Network {
        let client = self.channels.get(&node.peer_addr).ok();
        PeerConnection {
            target,
            nudge: self.nudge.clone(),
            client,
            channels: self.channels.clone(),
            addr: node.peer_addr.clone(),
        }
    }
}

/// A transport failure, as an error openraft understands.
#[derive(Debug, thiserror::Error)]
#[error("peer {addr}: {message}")]
struct TransportError {
    addr: String,
    message: String,
}

enum CallError {
    Unreachable(Unreachable),
    Network(NetworkError),
}

impl PeerConnection {
    async fn call<Req, Resp, Fut>(
        &mut self,
        req: &Req,
        timeout: Duration,
        rpc: impl FnOnce(PeerClient<Channel>, tonic::Request<Payload>) -> Fut,
    ) -> Result<Resp, CallError>
    where
        Req: serde::Serialize,
        Resp: DeserializeOwned,
        Fut: Future<Output = Result<tonic::Response<Payload>, tonic::Status>>,
    {
        let err = |message: String| TransportError {
            addr: self.addr.clone(),
            message,
        };
        let Some(client) = self.client.clone() else {
            return Err(CallError::Unreachable(Unreachable::new(&err(
                "invalid peer address".into(),
            ))));
        };
        let data =
            encode(req).map_err(|e| CallError::Network(NetworkError::new(&err(e.to_string()))))?;
        match rpc(client, self.channels.request(data, timeout)).await {
            Ok(resp) => decode(&resp.into_inner().data).map_err(|e| {
                CallError::Network(NetworkError::new(&err(format!("bad reply: {e}"))))
            }),
            Err(status) if status.code() == tonic::Code::Unavailable => Err(
                CallError::Unreachable(Unreachable::new(&err(status.to_string()))),
            ),
            Err(status) => Err(CallError::Network(NetworkError::new(&err(
                status.to_string()
            )))),
        }
    }
}

fn rpc_error<E: std::error::Error>(e: CallError) -> RPCError<NodeId, Member, E> {
    match e {
        CallError::Unreachable(u) => RPCError::Unreachable(u),
        CallError::Network(n) => RPCError::Network(n),
    }
}

impl RaftNetwork<TypeConfig> for PeerConnection {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, Member, RaftError<NodeId>>> {
        let reply: Result<AppendEntriesResponse<NodeId>, RaftError<NodeId>> = self
            .call(&rpc, option.hard_ttl(), |mut c, r| async move {
                c.append_entries(r).await
            })
            .await
            .map_err(rpc_error)?;
        reply.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<NodeId>,
        RPCError<NodeId, Member, RaftError<NodeId, InstallSnapshotError>>,
    > {
        let reply: Result<
            InstallSnapshotResponse<NodeId>,
            RaftError<NodeId, InstallSnapshotError>,
        > = self
            .call(&rpc, option.hard_ttl(), |mut c, r| async move {
                c.install_snapshot(r).await
            })
            .await
            .map_err(rpc_error)?;
        reply.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, Member, RaftError<NodeId>>> {
        let called = self
            .call(&rpc, option.hard_ttl(), |mut c, r| async move {
                c.vote(r).await
            })
            .await;
        if let Err(CallError::Network(_)) = &called {
            // A vote that got no answer in time, from a peer that accepted
            // the connection. A connection that lost packets can sit in
            // TCP's retransmission back-off for seconds after the loss is
            // over, and every request on it waits, while a new one answers
            // at once (chaos seed 3: a member's votes to its one reachable
            // peer timed out for 2.3 s after a lossy link had healed, and
            // the election took 3.6 s). The next vote, and whoever asks for
            // this peer's client next, goes on a new connection; a peer
            // that is really stopped costs a connection per vote round.
            if let Ok(client) = self.channels.reconnect(&self.addr) {
                self.client = Some(client);
            }
        }
        let reply: Result<VoteResponse<NodeId>, RaftError<NodeId>> = called.map_err(rpc_error)?;
        if let Ok(resp) = &reply {
            self.nudge.after_vote(&rpc, resp);
        }
        reply.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }

    fn backoff(&self) -> openraft::network::Backoff {
        // Retry a down peer every 200 ms: a restarted node rejoins quickly,
        // and a dead one costs a connect attempt five times a second.
        openraft::network::Backoff::new(std::iter::repeat(Duration::from_millis(200)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A4 (cell review): every linearizable read opened a new connection
    /// to every voter, because each new client got a new channel.
    #[tokio::test]
    async fn a4_clients_for_one_peer_share_one_channel() {
        let mut factory = NetworkFactory::default();
        let peer = Member {
            peer_addr: "127.0.0.1:9".to_string(),
        };
        for _ in 0..100 {
            let connection = factory.new_client(2, &peer).await;
            assert!(connection.client.is_some());
        }
        let other = Member {
            peer_addr: "127.0.0.1:10".to_string(),
        };
        factory.new_client(3, &other).await;
        assert_eq!(factory.channels.len(), 2, "one channel per peer address");
    }

    /// A peer whose connection takes requests and never answers them (a
    /// connection stuck in TCP's back-off looks the same from here): each
    /// vote that times out sends the next one on a new connection.
    #[tokio::test]
    async fn a_vote_that_times_out_is_followed_by_one_on_a_new_connection() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = accepted.clone();
        // Accepts and holds every connection, reading nothing.
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((socket, _)) = listener.accept().await {
                counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                held.push(socket);
            }
        });
        let mut factory = NetworkFactory::default();
        let peer = Member {
            peer_addr: addr.clone(),
        };
        let option = RPCOption::new(Duration::from_millis(300));
        for round in 1..=3u64 {
            let mut connection = factory.new_client(2, &peer).await;
            let vote = VoteRequest::new(openraft::Vote::new(round, 1), None);
            let answer = connection.vote(vote, option.clone()).await;
            assert!(answer.is_err(), "round {round}: a peer that never answers");
        }
        assert_eq!(
            accepted.load(std::sync::atomic::Ordering::SeqCst),
            3,
            "one connection per vote that timed out"
        );
    }
}
