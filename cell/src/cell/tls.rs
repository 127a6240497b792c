//! The member's TLS, loaded from the files its flags name before anything
//! is bound (a file that cannot be used stops the start, naming it), and
//! the warning that names the listeners left in plain text.

use crate::config::Config;
use anyhow::Context;
use latchkey_shared::tls::flags::warn_plaintext;
use latchkey_shared::tls::{Alpn, ClientCerts, ClientTls, ServerTls};

pub(super) struct MemberTls {
    /// `--client-addr` (gRPC).
    pub(super) client: Option<ServerTls>,
    /// `--metrics-addr`, with `--metrics-tls`.
    pub(super) metrics: Option<ServerTls>,
    /// `--peer-addr`: mutual TLS, certificates of the cell's CA.
    pub(super) peer: Option<ServerTls>,
    /// This member dialling the others, with its peer certificate.
    pub(super) peer_client: Option<ClientTls>,
}

impl MemberTls {
    pub(super) fn load(cfg: &Config) -> anyhow::Result<MemberTls> {
        let client_certs = cfg.tls.client_certs();
        let client = cfg
            .tls
            .files()
            .map(|files| ServerTls::load("client", &files, client_certs, Alpn::H2))
            .transpose()
            .context("--cert-file, --key-file, --trusted-ca-file")?;
        let metrics = match (cfg.tls.metrics_tls, cfg.tls.files()) {
            (true, Some(files)) => Some(
                ServerTls::load("metrics", &files, ClientCerts::NotAsked, Alpn::Http1)
                    .context("--metrics-tls with --cert-file, --key-file")?,
            ),
            _ => None,
        };
        let peer = cfg
            .peer_tls
            .server_files()
            .map(|files| ServerTls::load("peer", &files, ClientCerts::Required, Alpn::H2))
            .transpose()
            .context("--peer-cert-file, --peer-key-file, --peer-trusted-ca-file")?;
        let peer_client = cfg
            .peer_tls
            .client_files()
            .map(|files| ClientTls::load("peer client", &files))
            .transpose()
            .context("--peer-cert-file, --peer-key-file, --peer-trusted-ca-file")?;
        warn_plaintext(&[
            ("--client-addr", client.is_some()),
            ("--peer-addr", peer.is_some()),
            ("--metrics-addr", metrics.is_some()),
        ]);
        Ok(MemberTls {
            client,
            metrics,
            peer,
            peer_client,
        })
    }
}
