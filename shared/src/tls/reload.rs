//! A TLS configuration kept current with its files.
//!
//! Every [`RELOAD_POLL`] the files are read again. When their bytes
//! changed, a new configuration is built and new connections use it
//! (connections already set up keep theirs). A failure (a file missing, a
//! key that does not match its certificate) keeps the configuration in
//! use, logs why at warn and counts `latchkey_tls_reloads_total` with
//! `outcome="failed"`; the same bytes are not tried again, new ones are.
//! cert-manager replaces a Secret's files together, but a copy made file
//! by file can be caught half-way: that fails once and loads at the next
//! poll.

use super::files::{read_all, TlsError};
use crate::metrics_catalog::TLS_RELOADS;
use arc_swap::ArcSwap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// How often the files are looked at: a certificate replaced on disk is in
/// use for new connections within about this long.
pub const RELOAD_POLL: Duration = Duration::from_secs(2);

/// A configuration and the files it is rebuilt from.
pub(crate) type Current<T> = Arc<ArcSwap<T>>;

/// Builds `T` from `paths` now (a failure is the caller's: a process does
/// not start with files it cannot use) and keeps it current in a task
/// that ends when the returned value is dropped. `side` names the
/// listener or client side in logs and metrics.
pub(crate) fn load<T, F>(
    side: &'static str,
    paths: Vec<PathBuf>,
    build: F,
) -> Result<Current<T>, TlsError>
where
    T: Send + Sync + 'static,
    F: Fn(&[Vec<u8>]) -> Result<T, TlsError> + Send + Sync + 'static,
{
    let bytes = read_all(&paths)?;
    let current = Arc::new(ArcSwap::from_pointee(build(&bytes)?));
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => {
            runtime.spawn(follow(side, paths, bytes, Arc::downgrade(&current), build));
        }
        Err(_) => tracing::warn!(side, "no runtime: TLS files are not reloaded"),
    }
    Ok(current)
}

async fn follow<T, F>(
    side: &'static str,
    paths: Vec<PathBuf>,
    mut last: Vec<Vec<u8>>,
    current: std::sync::Weak<ArcSwap<T>>,
    build: F,
) where
    F: Fn(&[Vec<u8>]) -> Result<T, TlsError>,
{
    let mut last_read_error = None;
    loop {
        tokio::time::sleep(RELOAD_POLL).await;
        let Some(current) = current.upgrade() else {
            return;
        };
        let bytes = match read_all(&paths) {
            Ok(bytes) => {
                last_read_error = None;
                bytes
            }
            Err(e) => {
                let why = e.to_string();
                if last_read_error.as_ref() != Some(&why) {
                    tracing::warn!(side, error = %why, "TLS files not reloaded; the ones loaded before stay in use");
                    metrics::counter!(TLS_RELOADS.name, "listener" => side, "outcome" => "failed")
                        .increment(1);
                    last_read_error = Some(why);
                }
                continue;
            }
        };
        if bytes == last {
            continue;
        }
        match build(&bytes) {
            Ok(config) => {
                current.store(Arc::new(config));
                tracing::info!(side, "TLS files changed on disk: new connections use them");
                metrics::counter!(TLS_RELOADS.name, "listener" => side, "outcome" => "ok")
                    .increment(1);
            }
            Err(e) => {
                tracing::warn!(side, error = %e, "TLS files changed on disk and cannot be used; the ones loaded before stay in use");
                metrics::counter!(TLS_RELOADS.name, "listener" => side, "outcome" => "failed")
                    .increment(1);
            }
        }
        last = bytes;
    }
}
