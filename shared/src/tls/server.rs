//! One listener's TLS, and the connections it accepts.
//!
//! [`Incoming`] owns a TCP listener in a task of its own: each accepted
//! socket gets `TCP_NODELAY` (tonic ignores its own setting for a server
//! fed from `serve_with_incoming*`, and with Nagle on every small answer
//! waits ~40 ms for the peer's delayed ACK) and, on a TLS listener, its
//! handshake in a task of its own, bounded by [`HANDSHAKE_TIMEOUT`] and at
//! most [`MAX_HANDSHAKES`] at once: a client that connects and says
//! nothing holds up no one, and plain text to a TLS port is an error at
//! once (rustls refuses a record that is not TLS), never a hang.

use super::files::{server_config, ServerFiles, TlsError};
use super::reload::{load, Current};
use crate::metrics_catalog::TLS_HANDSHAKE_FAILURES;
use rustls::ServerConfig;
use rustls_pki_types::{CertificateDer, ServerName};
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Semaphore};

/// How long a TLS handshake may take before the connection is closed.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Handshakes in progress at once on one listener; further connections
/// wait in the kernel's backlog.
pub const MAX_HANDSHAKES: usize = 256;

/// Connections accepted and not yet taken by the server.
const ACCEPTED_QUEUE: usize = 128;

/// Which application protocol a listener speaks (ALPN): a gRPC client
/// insists on HTTP/2, a browser or curl may offer both.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Alpn {
    /// gRPC: HTTP/2 only.
    H2,
    /// The HTTP/JSON API and `/metrics`: HTTP/1.1.
    Http1,
}

impl Alpn {
    fn protocols(self) -> &'static [&'static [u8]] {
        match self {
            Alpn::H2 => &[b"h2"],
            Alpn::Http1 => &[b"http/1.1"],
        }
    }
}

/// Whether a listener asks its clients for certificates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientCerts {
    /// Any client may connect (server TLS only).
    NotAsked,
    /// A client without a certificate signed by the trusted CA is refused
    /// in the handshake (etcd's `--client-cert-auth`; always between
    /// members).
    Required,
}

/// One listener's TLS configuration, kept current with its files.
#[derive(Clone)]
pub struct ServerTls {
    listener: &'static str,
    config: Current<ServerConfig>,
}

impl ServerTls {
    /// Loads `files` for the listener named `listener` (in logs and
    /// metrics); fails naming the file that cannot be used.
    pub fn load(
        listener: &'static str,
        files: &ServerFiles,
        client_certs: ClientCerts,
        alpn: Alpn,
    ) -> Result<ServerTls, TlsError> {
        let require = client_certs == ClientCerts::Required;
        let owned = files.clone();
        let config = load(listener, files.paths(), move |bytes| {
            server_config(&owned, bytes, require, alpn.protocols())
        })?;
        Ok(ServerTls { listener, config })
    }
}

/// Who is at the other end of an accepted connection: its address and,
/// on a listener that requires client certificates, the certificate it
/// presented (already verified against the listener's trusted CA).
#[derive(Debug, Clone)]
pub struct RemotePeer {
    pub addr: SocketAddr,
    pub certificate: Option<Arc<CertificateDer<'static>>>,
}

impl RemotePeer {
    /// The peer's certificate names `host` (a DNS name or an IP address in
    /// its subject alternative names). False without a certificate.
    pub fn certificate_names(&self, host: &str) -> bool {
        self.certificate_names_any([host])
    }

    /// The peer's certificate names one of `hosts`; the certificate is
    /// parsed once, however many hosts are asked about.
    pub fn certificate_names_any<'a>(&self, hosts: impl IntoIterator<Item = &'a str>) -> bool {
        let Some(der) = &self.certificate else {
            return false;
        };
        let Ok(cert) = webpki::EndEntityCert::try_from(der.as_ref()) else {
            return false;
        };
        hosts.into_iter().any(|host| {
            ServerName::try_from(host)
                .is_ok_and(|name| cert.verify_is_valid_for_subject_name(&name).is_ok())
        })
    }

    /// The peer of a gRPC request served from an [`Incoming`].
    pub fn of<T>(request: &tonic::Request<T>) -> Option<&RemotePeer> {
        request.extensions().get::<RemotePeer>()
    }
}

/// An accepted connection: TCP, or TLS over it.
pub struct ServerIo {
    stream: Stream,
    peer: RemotePeer,
}

enum Stream {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>),
}

impl ServerIo {
    pub fn peer(&self) -> &RemotePeer {
        &self.peer
    }
}

impl AsyncRead for ServerIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match &mut self.get_mut().stream {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for ServerIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match &mut self.get_mut().stream {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match &mut self.get_mut().stream {
            Stream::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match &self.stream {
            Stream::Plain(s) => s.is_write_vectored(),
            Stream::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().stream {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().stream {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

impl tonic::transport::server::Connected for ServerIo {
    type ConnectInfo = RemotePeer;

    fn connect_info(&self) -> RemotePeer {
        self.peer.clone()
    }
}

/// The connections of one listener, ready for a server: a stream for
/// tonic's `serve_with_incoming*`, a `Listener` for `axum::serve`.
pub struct Incoming {
    accepted: mpsc::Receiver<ServerIo>,
    local_addr: SocketAddr,
}

impl Incoming {
    /// Accepts on `listener` until this is dropped, with TLS when `tls`
    /// is given.
    pub fn new(listener: TcpListener, tls: Option<ServerTls>) -> io::Result<Incoming> {
        let local_addr = listener.local_addr()?;
        let (tx, accepted) = mpsc::channel(ACCEPTED_QUEUE);
        tokio::spawn(accept_loop(listener, tls, tx));
        Ok(Incoming {
            accepted,
            local_addr,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The next connection; `None` only if the accepting task ended.
    pub async fn next_connection(&mut self) -> Option<ServerIo> {
        self.accepted.recv().await
    }
}

impl tokio_stream::Stream for Incoming {
    type Item = io::Result<ServerIo>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.accepted.poll_recv(cx).map(|io| io.map(Ok))
    }
}

#[cfg(feature = "http")]
mod axum_listener {
    use super::{Incoming, RemotePeer, ServerIo};
    use axum::extract::connect_info::Connected;
    use axum::serve::IncomingStream;

    impl axum::serve::Listener for Incoming {
        type Io = ServerIo;
        type Addr = RemotePeer;

        async fn accept(&mut self) -> (ServerIo, RemotePeer) {
            match self.next_connection().await {
                Some(io) => {
                    let peer = io.peer().clone();
                    (io, peer)
                }
                // The accepting task never ends while this lives; if it
                // did, no connection will come.
                None => std::future::pending().await,
            }
        }

        fn local_addr(&self) -> std::io::Result<RemotePeer> {
            Ok(RemotePeer {
                addr: self.local_addr,
                certificate: None,
            })
        }
    }

    impl Connected<IncomingStream<'_, Incoming>> for RemotePeer {
        fn connect_info(stream: IncomingStream<'_, Incoming>) -> Self {
            stream.remote_addr().clone()
        }
    }
}

async fn accept_loop(listener: TcpListener, tls: Option<ServerTls>, tx: mpsc::Sender<ServerIo>) {
    let handshakes = Arc::new(Semaphore::new(MAX_HANDSHAKES));
    loop {
        let accepted = tokio::select! {
            _ = tx.closed() => return,
            accepted = listener.accept() => accepted,
        };
        let (tcp, addr) = match accepted {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of file descriptors and the like: the listener is
                // still good, and the condition passes.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "TCP_NODELAY not set");
        }
        let Some(tls) = &tls else {
            let io = ServerIo {
                stream: Stream::Plain(tcp),
                peer: RemotePeer {
                    addr,
                    certificate: None,
                },
            };
            if tx.send(io).await.is_err() {
                return;
            }
            continue;
        };
        let Ok(permit) = handshakes.clone().acquire_owned().await else {
            return;
        };
        let acceptor = tokio_rustls::TlsAcceptor::from(tls.config.load_full());
        let listener_name = tls.listener;
        let tx = tx.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let stream = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(stream)) => stream,
                Ok(Err(e)) => {
                    tracing::debug!(listener = listener_name, %addr, error = %e, "TLS handshake failed");
                    metrics::counter!(TLS_HANDSHAKE_FAILURES.name, "listener" => listener_name)
                        .increment(1);
                    return;
                }
                Err(_) => {
                    tracing::debug!(listener = listener_name, %addr, "no TLS handshake in time");
                    metrics::counter!(TLS_HANDSHAKE_FAILURES.name, "listener" => listener_name)
                        .increment(1);
                    return;
                }
            };
            let certificate = stream
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|chain| chain.first())
                .map(|cert| Arc::new(cert.clone().into_owned()));
            let io = ServerIo {
                stream: Stream::Tls(Box::new(stream)),
                peer: RemotePeer { addr, certificate },
            };
            let _ = tx.send(io).await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tls::client::ClientTls;
    use crate::tls::files::ClientFiles;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// `scripts/make-certs.sh DIR names...`: the recipe the docs give.
    fn make_certs(dir: &std::path::Path, names: &[&str]) {
        let script =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/make-certs.sh");
        let out = std::process::Command::new("bash")
            .arg(script)
            .arg(dir)
            .args(names)
            .output()
            .expect("bash runs");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// A TLS client of `addr` with `config`, its first read after sending
    /// a byte: `Ok` with what came back, `Err` once refused.
    async fn exchange(config: Arc<rustls::ClientConfig>, addr: SocketAddr) -> io::Result<Vec<u8>> {
        let tcp = TcpStream::connect(addr).await?;
        let name = ServerName::try_from("127.0.0.1").expect("name");
        let mut tls = tokio_rustls::TlsConnector::from(config)
            .connect(name, tcp)
            .await?;
        tls.write_all(b"x").await?;
        let mut buf = vec![0; 1];
        let n = tls.read(&mut buf).await?;
        if n == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "closed"));
        }
        Ok(buf)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_listener_requiring_certificates_takes_its_cas_and_refuses_the_rest_at_once() {
        let dir = tempfile::tempdir().expect("temp dir");
        let (ours, theirs) = (dir.path().join("ours"), dir.path().join("theirs"));
        make_certs(&ours, &["server=IP:127.0.0.1", "alice=DNS:alice"]);
        make_certs(&theirs, &["alice=DNS:alice"]);
        let files = ServerFiles {
            cert: ours.join("server.pem"),
            key: ours.join("server-key.pem"),
            trusted_ca: Some(ours.join("ca.pem")),
        };
        let tls = ServerTls::load("test", &files, ClientCerts::Required, Alpn::H2).expect("load");
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let mut incoming = Incoming::new(listener, Some(tls)).expect("incoming");
        tokio::spawn(async move {
            while let Some(mut io) = incoming.next_connection().await {
                // Echo one byte back, then say whose certificate it was.
                let peer = io.peer().clone();
                let mut buf = [0u8; 1];
                if io.read_exact(&mut buf).await.is_ok() {
                    let answer =
                        if peer.certificate_names("alice") && !peer.certificate_names("bob") {
                            b"a"
                        } else {
                            b"?"
                        };
                    let _ = io.write_all(answer).await;
                }
            }
        });
        let client = |ca: &std::path::Path, who: Option<&std::path::Path>| {
            let files = ClientFiles {
                trusted_ca: ca.join("ca.pem"),
                cert_and_key: who.map(|dir| (dir.join("alice.pem"), dir.join("alice-key.pem"))),
            };
            ClientTls::load("test client", &files)
                .expect("client")
                .config
                .load_full()
        };
        let answer = exchange(client(&ours, Some(&ours)), addr)
            .await
            .expect("alice of our CA");
        assert_eq!(answer, b"a", "the listener saw alice's certificate");
        for (what, config) in [
            ("no certificate", client(&ours, None)),
            ("another CA's certificate", client(&ours, Some(&theirs))),
        ] {
            let refused =
                tokio::time::timeout(Duration::from_secs(5), exchange(config, addr)).await;
            assert!(matches!(refused, Ok(Err(_))), "{what}: {refused:?}");
        }
        // Plain text: the connection closes at the first bytes.
        let mut plain = TcpStream::connect(addr).await.expect("connect");
        plain
            .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
            .await
            .expect("write");
        let mut buf = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(5), plain.read_to_end(&mut buf)).await;
        assert!(read.is_ok(), "plain text to a TLS port hung");
    }

    /// Every accepted socket has Nagle off, or each small answer waits
    /// ~40 ms for the peer's delayed ACK (cell issue 10: serializable
    /// ranges ran at 1.7k/s with Nagle on, 26k/s with it off).
    #[tokio::test]
    async fn every_accepted_socket_has_tcp_nodelay_set() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let mut incoming = Incoming::new(listener, None).expect("incoming");
        for _ in 0..3 {
            let client = tokio::net::TcpStream::connect(addr).await.expect("connect");
            let accepted = incoming.next_connection().await.expect("a connection");
            let super::Stream::Plain(tcp) = &accepted.stream else {
                panic!("a plain listener gave a TLS stream");
            };
            assert!(tcp.nodelay().expect("read TCP_NODELAY"));
            assert_eq!(accepted.peer().addr, client.local_addr().expect("addr"));
            drop(client);
        }
    }
}
