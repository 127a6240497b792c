//! TLS on every listener and every connection latchkey makes: rustls with
//! ring (no OpenSSL, no C++ build).
//!
//! - [`files`]: the PEM files of one side ([`ServerFiles`], [`ClientFiles`])
//!   and the rustls configurations built from their bytes.
//! - [`reload`]: a configuration kept current with its files while the
//!   process runs (how cert-manager rotates certificates).
//! - [`server`]: [`ServerTls`], one listener's TLS, and [`Incoming`], the
//!   connections of a TCP listener after their handshake (or plain, when the
//!   listener has no TLS), each with its [`RemotePeer`]; tonic and axum
//!   servers both take them.
//! - [`client`]: [`ClientTls`], the client side (a proxy towards its cells,
//!   a member towards its peers), and the tonic channels dialled through it.
//!
//! Names: a server's certificate must name the host a client dials (a DNS
//! name or an IP address in its subject alternative names, as browsers and
//! etcd check them). Between members, the name is also the identity: a
//! member accepts peer traffic only from a certificate that names the host
//! of a member's peer address in the membership
//! ([`RemotePeer::certificate_names`]).

pub mod client;
pub mod files;
pub mod flags;
pub mod reload;
pub mod server;

pub use client::ClientTls;
pub use files::{ClientFiles, ServerFiles, TlsError};
pub use server::{Alpn, ClientCerts, Incoming, RemotePeer, ServerIo, ServerTls};

use std::sync::Arc;

/// The one crypto provider: ring, named explicitly so that no process-wide
/// default has to be installed first. rustls 0.23.48 marks it deprecated
/// because ring has no post-quantum key exchange (X25519MLKEM768, which
/// aws-lc-rs has); aws-lc-rs would add a large C build to every clean
/// build. Moving to it is one line here (and the features in Cargo.toml).
#[allow(deprecated)]
pub(crate) fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}
