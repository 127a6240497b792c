//! The TLS flags, named as etcd names them so that operators carry their
//! habits over, each with a `LATCHKEY_*` fallback. The cell and the proxy
//! flatten the groups they serve into their own configuration.

use super::files::{ClientFiles, ServerFiles};
use super::server::ClientCerts;
use std::path::PathBuf;

/// The client-facing listeners' TLS: a member's client port, a proxy's
/// HTTP and gRPC ports (and, with `--metrics-tls`, the metrics port).
#[derive(Debug, Clone, Default, PartialEq, Eq, clap::Args)]
pub struct ListenerFlags {
    /// Certificate chain (PEM) of the client-facing listeners; with
    /// --key-file, they speak TLS only. It must name the host clients
    /// dial. Reloaded when it changes on disk.
    #[arg(long, env = "LATCHKEY_CERT_FILE", requires = "key_file")]
    pub cert_file: Option<PathBuf>,

    /// Private key (PEM) of --cert-file.
    #[arg(long, env = "LATCHKEY_KEY_FILE", requires = "cert_file")]
    pub key_file: Option<PathBuf>,

    /// CA certificates (PEM) that sign the client certificates accepted
    /// with --client-cert-auth.
    #[arg(long, env = "LATCHKEY_TRUSTED_CA_FILE")]
    pub trusted_ca_file: Option<PathBuf>,

    /// Refuse clients without a certificate signed by --trusted-ca-file
    /// (in the TLS handshake). The certificate's common name is the
    /// client's identity.
    #[arg(long, env = "LATCHKEY_CLIENT_CERT_AUTH", requires = "trusted_ca_file")]
    pub client_cert_auth: bool,

    /// Serve /metrics, /healthz and /readyz over TLS too, with --cert-file
    /// (never asking for client certificates, so probes and scrapers need
    /// only the CA).
    #[arg(long, env = "LATCHKEY_METRICS_TLS", requires = "cert_file")]
    pub metrics_tls: bool,
}

impl ListenerFlags {
    /// Whether the client-facing listeners ask for client certificates.
    pub fn client_certs(&self) -> ClientCerts {
        if self.client_cert_auth {
            ClientCerts::Required
        } else {
            ClientCerts::NotAsked
        }
    }

    /// The listeners' files, when TLS is asked for.
    pub fn files(&self) -> Option<ServerFiles> {
        Some(ServerFiles {
            cert: self.cert_file.clone()?,
            key: self.key_file.clone()?,
            trusted_ca: self.trusted_ca_file.clone(),
        })
    }
}

/// A member's peer port and its connections to the other members: mutual
/// TLS, both sides' certificates signed by --peer-trusted-ca-file.
#[derive(Debug, Clone, Default, PartialEq, Eq, clap::Args)]
pub struct PeerFlags {
    /// This member's certificate chain (PEM) for Raft and forwarded
    /// traffic, served on --peer-addr and presented to the other members.
    /// It must name the host of this member's peer address (its
    /// --advertise-peer-addr): that name is how the others know it.
    #[arg(
        long,
        env = "LATCHKEY_PEER_CERT_FILE",
        requires_all = ["peer_key_file", "peer_trusted_ca_file"]
    )]
    pub peer_cert_file: Option<PathBuf>,

    /// Private key (PEM) of --peer-cert-file.
    #[arg(long, env = "LATCHKEY_PEER_KEY_FILE", requires = "peer_cert_file")]
    pub peer_key_file: Option<PathBuf>,

    /// The cell's CA certificates (PEM): a member accepts peer traffic only
    /// from a certificate they sign that names a member of the cell.
    #[arg(
        long,
        env = "LATCHKEY_PEER_TRUSTED_CA_FILE",
        requires = "peer_cert_file"
    )]
    pub peer_trusted_ca_file: Option<PathBuf>,
}

impl PeerFlags {
    /// The peer listener's files, when peer TLS is asked for.
    pub fn server_files(&self) -> Option<ServerFiles> {
        Some(ServerFiles {
            cert: self.peer_cert_file.clone()?,
            key: self.peer_key_file.clone()?,
            trusted_ca: Some(self.peer_trusted_ca_file.clone()?),
        })
    }

    /// The files this member dials its peers with.
    pub fn client_files(&self) -> Option<ClientFiles> {
        Some(ClientFiles {
            trusted_ca: self.peer_trusted_ca_file.clone()?,
            cert_and_key: Some((self.peer_cert_file.clone()?, self.peer_key_file.clone()?)),
        })
    }
}

/// A proxy's connections to its cells' members (etcd's grpc-proxy names
/// them so).
#[derive(Debug, Clone, Default, PartialEq, Eq, clap::Args)]
pub struct UpstreamFlags {
    /// CA certificates (PEM) that sign the members' client certificates;
    /// given, the proxy speaks TLS to its cells.
    #[arg(long = "cacert", env = "LATCHKEY_CACERT")]
    pub cacert: Option<PathBuf>,

    /// The proxy's own certificate (PEM) towards the cells (for a cell
    /// started with --client-cert-auth).
    #[arg(long = "cert", env = "LATCHKEY_CERT", requires_all = ["key", "cacert"])]
    pub cert: Option<PathBuf>,

    /// Private key (PEM) of --cert.
    #[arg(long = "key", env = "LATCHKEY_KEY", requires = "cert")]
    pub key: Option<PathBuf>,
}

impl UpstreamFlags {
    pub fn files(&self) -> Option<ClientFiles> {
        Some(ClientFiles {
            trusted_ca: self.cacert.clone()?,
            cert_and_key: self.cert.clone().zip(self.key.clone()),
        })
    }
}

/// The plain-text listeners among `(flag, tls on)`, for the warning a
/// process gives at start: "these listeners are open to anyone who
/// reaches them".
pub fn warn_plaintext(listeners: &[(&str, bool)]) {
    let open: Vec<&str> = listeners
        .iter()
        .filter(|(_, tls)| !tls)
        .map(|(name, _)| *name)
        .collect();
    if !open.is_empty() {
        tracing::warn!(
            listeners = %open.join(", "),
            "plain text: these listeners have no TLS, and whoever reaches them is trusted \
             (certificate flags turn TLS on; see docs/security.md)"
        );
    }
}
