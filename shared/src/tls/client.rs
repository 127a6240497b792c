//! The client side of TLS: tonic channels that dial TCP, set
//! `TCP_NODELAY`, and set up TLS with the configuration current at the
//! time of each connect (so a rotated client certificate is used from the
//! next reconnect on).
//!
//! The server's certificate must name the host of the address dialled (a
//! DNS name, or an IP address for an `ip:port` address).

use super::files::{client_config, ClientFiles, TlsError};
use super::reload::{load, Current};
use hyper_util::rt::TokioIo;
use rustls::ClientConfig;
use rustls_pki_types::ServerName;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::net::{TcpSocket, TcpStream};
use tonic::codegen::http::Uri;
use tonic::transport::{Channel, Endpoint};

/// A client side's TLS configuration, kept current with its files.
#[derive(Clone)]
pub struct ClientTls {
    pub(crate) config: Current<ClientConfig>,
}

impl ClientTls {
    /// Loads `files` for the client side named `side` (in logs and
    /// metrics); fails naming the file that cannot be used.
    pub fn load(side: &'static str, files: &ClientFiles) -> Result<ClientTls, TlsError> {
        let owned = files.clone();
        let config = load(side, files.paths(), move |bytes| {
            client_config(&owned, bytes)
        })?;
        Ok(ClientTls { config })
    }
}

/// A lazily connecting channel to `endpoint`: plain when `tls` is `None`,
/// else TLS with it, dialled from `local` when given. Every other setting
/// of the endpoint (timeouts, HTTP/2 windows and keep-alive) applies; the
/// connect timeout covers the TLS handshake too.
pub fn lazy_channel(
    endpoint: &Endpoint,
    tls: Option<&ClientTls>,
    local: Option<IpAddr>,
) -> Channel {
    match tls {
        None => endpoint.clone().local_address(local).connect_lazy(),
        Some(tls) => endpoint.connect_with_connector_lazy(TlsConnect {
            config: tls.config.clone(),
            local,
        }),
    }
}

/// A channel to `endpoint` connected now: plain when `tls` is `None`,
/// else TLS with it.
pub async fn connect(
    endpoint: &Endpoint,
    tls: Option<&ClientTls>,
) -> Result<Channel, tonic::transport::Error> {
    match tls {
        None => endpoint.connect().await,
        Some(tls) => {
            endpoint
                .connect_with_connector(TlsConnect {
                    config: tls.config.clone(),
                    local: None,
                })
                .await
        }
    }
}

/// Dials TCP and sets up TLS; tonic's connector for TLS channels.
#[derive(Clone)]
struct TlsConnect {
    config: Current<ClientConfig>,
    local: Option<IpAddr>,
}

type Connecting = Pin<
    Box<
        dyn Future<Output = io::Result<TokioIo<tokio_rustls::client::TlsStream<TcpStream>>>> + Send,
    >,
>;

impl tonic::codegen::Service<Uri> for TlsConnect {
    type Response = TokioIo<tokio_rustls::client::TlsStream<TcpStream>>;
    type Error = io::Error;
    type Future = Connecting;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Connecting {
        let config = self.config.load_full();
        let local = self.local;
        Box::pin(async move {
            let invalid =
                |why: &str| io::Error::new(io::ErrorKind::InvalidInput, format!("{uri}: {why}"));
            let host = uri
                .host()
                .ok_or_else(|| invalid("no host"))?
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_string();
            let port = uri.port_u16().ok_or_else(|| invalid("no port"))?;
            let name = ServerName::try_from(host.clone())
                .map_err(|_| invalid("the host is neither a DNS name nor an IP address"))?;
            let addr = tokio::net::lookup_host((host.as_str(), port))
                .await?
                .next()
                .ok_or_else(|| invalid("the host has no address"))?;
            let tcp = dial(addr, local).await?;
            tcp.set_nodelay(true)?;
            let tls = tokio_rustls::TlsConnector::from(config)
                .connect(name, tcp)
                .await?;
            Ok(TokioIo::new(tls))
        })
    }
}

async fn dial(addr: SocketAddr, local: Option<IpAddr>) -> io::Result<TcpStream> {
    let Some(local) = local else {
        return TcpStream::connect(addr).await;
    };
    let socket = match addr {
        SocketAddr::V4(_) => TcpSocket::new_v4()?,
        SocketAddr::V6(_) => TcpSocket::new_v6()?,
    };
    socket.bind(SocketAddr::new(local, 0))?;
    socket.connect(addr).await
}
