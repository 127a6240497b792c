//! The proxy's TLS, loaded from the files its flags name before anything
//! is bound (a file that cannot be used stops the start, naming it): its
//! HTTP, gRPC and (with `--metrics-tls`) metrics listeners, and its
//! connections to the cells. The warning at start names the listeners
//! left in plain text.

use crate::config::Config;
use anyhow::Context;
use latchkey_shared::tls::flags::warn_plaintext;
use latchkey_shared::tls::{Alpn, ClientCerts, ClientTls, ServerTls};

pub(crate) struct ProxyTls {
    pub(crate) http: Option<ServerTls>,
    pub(crate) grpc: Option<ServerTls>,
    pub(crate) metrics: Option<ServerTls>,
    /// Towards the cells' members (`--cacert`, `--cert`, `--key`).
    pub(crate) upstream: Option<ClientTls>,
}

impl ProxyTls {
    pub(crate) fn load(cfg: &Config) -> anyhow::Result<ProxyTls> {
        let client_certs = cfg.tls.client_certs();
        let listener = |name: &'static str, certs: ClientCerts, alpn: Alpn| {
            cfg.tls
                .files()
                .map(|files| ServerTls::load(name, &files, certs, alpn))
                .transpose()
                .context("--cert-file, --key-file, --trusted-ca-file")
        };
        let http = listener("http", client_certs, Alpn::Http1)?;
        let grpc = listener("grpc", client_certs, Alpn::H2)?;
        let metrics = if cfg.tls.metrics_tls {
            listener("metrics", ClientCerts::NotAsked, Alpn::Http1)?
        } else {
            None
        };
        let upstream = cfg
            .upstream_tls
            .files()
            .map(|files| ClientTls::load("cells", &files))
            .transpose()
            .context("--cacert, --cert, --key")?;
        warn_plaintext(&[
            ("--http-addr", http.is_some()),
            ("--grpc-addr", grpc.is_some()),
            ("--metrics-addr", metrics.is_some()),
        ]);
        if upstream.is_none() && !cfg.dev {
            tracing::warn!(
                cells = ?cfg.cells,
                "plain text to the cells: no --cacert (see docs/security.md)"
            );
        }
        Ok(ProxyTls {
            http,
            grpc,
            metrics,
            upstream,
        })
    }
}
