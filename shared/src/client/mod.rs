//! # The latchkey client
//!
//! The one Rust client for a cell's client address, used by the session
//! type, the proxy's keep-alive batcher, the load test and the tests.
//!
//! ## Layout
//! - this file: [`endpoint`] and [`connect`], the ONE way to build a channel
//!   to a cell member (timeouts, `TCP_NODELAY`, HTTP/2 keep-alive), and
//!   [`ClientError`], the errors of every client call.
//! - [`call`]: one unary, server-streaming or bidirectional call by
//!   method path, etcd's messages passed through as they are (the proxy).
//! - [`refresh_stream`]: [`RefreshStream`], batched lease refresh on
//!   latchkey's `Sessions.Refresh` stream: one request names many leases,
//!   answers are matched by batch number, a failed member is left for the
//!   next one (the leader first, when a reply named it).
//! - [`keepalive_stream`]: [`KeepAliveStream`], etcd's own
//!   `Lease/LeaseKeepAlive` stream carrying many leases, as a proxy would
//!   use it against any etcd v3 server.
//! - [`own_credentials`]: [`OwnCredentials`], the token (and the proxies' key) a process presents for its
//!   own calls once the cell has authentication on.
//! - [`session`]: [`Session`], one lease granted and kept alive on a
//!   [`RefreshStream`], observable as Alive / Jeopardy / Expired.
//! - [`watches`]: [`watches::open_watches`], one raw Watch stream
//!   carrying many watches of a key (fan-out tests and benchmarks).
//!
//! Data flows one way: a caller hands lease ids to a stream, the stream
//! sends them on a channel from [`connect`] and hands back one TTL per id.
//! A TTL of 0 or less means the lease is gone ([`is_gone`]).

pub mod call;
pub mod keepalive_stream;
pub mod own_credentials;
pub mod refresh_stream;
pub mod session;
pub mod watches;

#[cfg(test)]
mod fake_cell;

pub use keepalive_stream::KeepAliveStream;
pub use own_credentials::OwnCredentials;
pub use refresh_stream::{RefreshReply, RefreshStream};
pub use session::{Session, SessionOptions, SessionState};

use crate::tls::ClientTls;
use std::time::Duration;
use tonic::transport::{Channel, Endpoint};

/// How long a TCP connect to a member may take. On loopback or in one
/// data centre a connect takes well under a millisecond; a member that has
/// not accepted within 2 s is down or partitioned, and a session with the
/// shortest TTL (2 s) is better served by trying the next member.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// How often an HTTP/2 PING checks a connection that carries a stream. A
/// member that vanished without closing its sockets (power loss, a
/// partition) is otherwise noticed only when the next call times out. etcd
/// servers close connections that ping more often than every 5 s
/// (`--grpc-keepalive-min-time`), so 10 s keeps clear of that.
pub const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(10);

/// How long the answer to a keep-alive PING may take before the connection
/// is closed: a live member answers a PING in microseconds, and 5 s also
/// covers a stop-the-world pause of the member's host.
pub const KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(5);

/// Whether a TTL from a refresh means the lease is gone. The batched
/// refresh answers -1 for a lease that does not exist; etcd's keep-alive
/// answers 0. Either way the lease's keys are deleted or about to be.
pub fn is_gone(ttl: i64) -> bool {
    ttl <= 0
}

/// An error of a client call, naming the member address it happened on.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("no endpoint given")]
    NoEndpoint,
    #[error("bad endpoint {addr:?}: {why}")]
    InvalidEndpoint { addr: String, why: String },
    #[error("connecting to {addr}: {source}")]
    Connect {
        addr: String,
        #[source]
        source: tonic::transport::Error,
    },
    /// The call failed with a gRPC status; on a stream, this also ends it.
    #[error("{addr} answered {}: {}", .status.code(), .status.message())]
    Rpc {
        addr: String,
        status: Box<tonic::Status>,
    },
    /// The member ended the stream without an error.
    #[error("{addr} ended the stream")]
    Closed { addr: String },
    #[error("no answer from {addr} within {after:?}")]
    TimedOut { addr: String, after: Duration },
    /// The member answered something the protocol does not allow.
    #[error("{addr} answered out of protocol: {why}")]
    Malformed { addr: String, why: String },
    /// Refused before sending: the cell rejects batches this large.
    #[error("a refresh batch of {len} leases is over the limit of {max}; split it")]
    BatchTooLarge { len: usize, max: usize },
}

impl ClientError {
    pub(crate) fn rpc(addr: &str, status: tonic::Status) -> ClientError {
        ClientError::Rpc {
            addr: addr.to_string(),
            status: Box::new(status),
        }
    }
}

/// The endpoint of a member's client address, `host:port` or
/// `http://host:port`, with the connect timeout, `TCP_NODELAY` (refresh
/// batches and keep-alives are small messages that must not wait for
/// Nagle's algorithm) and HTTP/2 keep-alive of this module. Nothing is
/// connected yet.
pub fn endpoint(addr: &str) -> Result<Endpoint, ClientError> {
    let invalid = |why: String| ClientError::InvalidEndpoint {
        addr: addr.to_string(),
        why,
    };
    let url = match addr.split_once("://") {
        None => format!("http://{addr}"),
        Some(("http", _)) => addr.to_string(),
        // Whether a connection speaks TLS is the caller's `ClientTls`; a
        // member's advertised https URL names the same address.
        Some(("https", rest)) => format!("http://{rest}"),
        Some((scheme, _)) => return Err(invalid(format!("scheme {scheme} is not supported"))),
    };
    let endpoint = Endpoint::from_shared(url).map_err(|e| invalid(e.to_string()))?;
    if endpoint.uri().port_u16().is_none() {
        return Err(invalid("no port".into()));
    }
    Ok(endpoint
        .connect_timeout(CONNECT_TIMEOUT)
        .tcp_nodelay(true)
        .http2_keep_alive_interval(KEEP_ALIVE_INTERVAL)
        .keep_alive_timeout(KEEP_ALIVE_TIMEOUT)
        // etcd counts a PING on a connection without a stream as abuse.
        .keep_alive_while_idle(false))
}

/// A connected channel to the member at `addr` (see [`endpoint`]).
pub async fn connect(addr: &str) -> Result<Channel, ClientError> {
    connect_with(addr, None).await
}

/// A connected channel to the member at `addr`, over TLS with `tls` when
/// given.
pub async fn connect_with(addr: &str, tls: Option<&ClientTls>) -> Result<Channel, ClientError> {
    crate::tls::client::connect(&endpoint(addr)?, tls)
        .await
        .map_err(|source| ClientError::Connect {
            addr: addr.to_string(),
            source,
        })
}

/// `host:port` of a member address, the form in which two spellings of
/// one address (`http://h:1`, `h:1/`) compare equal.
pub(crate) fn authority(addr: &str) -> Option<String> {
    let endpoint = endpoint(addr).ok()?;
    endpoint
        .uri()
        .authority()
        .map(|a| a.as_str().to_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_accept_host_port_with_or_without_http() {
        for addr in [
            "127.0.0.1:7801",
            "http://127.0.0.1:7801",
            "http://127.0.0.1:7801/",
            "https://127.0.0.1:7801",
        ] {
            let endpoint = endpoint(addr).expect("valid");
            assert_eq!(endpoint.uri().port_u16(), Some(7801), "{addr}");
            assert_eq!(authority(addr).as_deref(), Some("127.0.0.1:7801"));
        }
        assert_eq!(authority("Node-1:7801").as_deref(), Some("node-1:7801"));
    }

    #[test]
    fn endpoints_refuse_other_schemes_and_missing_ports() {
        for addr in ["unix:///tmp/x", "127.0.0.1", "", "a b:1"] {
            assert!(
                matches!(endpoint(addr), Err(ClientError::InvalidEndpoint { .. })),
                "{addr:?} was accepted"
            );
        }
    }

    #[tokio::test]
    async fn connecting_to_a_closed_port_fails_with_the_address() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        drop(listener);
        let result = tokio::time::timeout(Duration::from_secs(5), connect(&addr)).await;
        match result {
            Ok(Err(ClientError::Connect { addr: a, .. })) => assert_eq!(a, addr),
            other => panic!("expected a connect error, got {other:?}"),
        }
    }
}
