//! The proxy's side of the directory of cells
//! ([`latchkey_shared::directory`]): [`CellMaker`] makes a client for a
//! cell the directory names, [`read`] reads the directory from the home
//! cell, and [`follow`] keeps [`Upstream`](super::Upstream) routing by the
//! newest one.
//!
//! A proxy reads the directory every `--directory-interval`, and at once when
//! a cell answers `wrong_cell`. A proxy that is behind routes some requests
//! to a cell that no longer owns their keys; that cell refuses them before
//! applying anything, and the proxy routes them again.

use super::cell_client::{Cell, CellClient, Kind, Route};
use super::identity::{CellIdentity, Credentials};
use super::leader_tracker::LeaderTracker;
use super::Upstream;
use latchkey_shared::directory::{Directory, DIRECTORY_KEY};
use latchkey_shared::etcd_methods::kv::RANGE;
use latchkey_shared::etcdpb::{PbRangeRequest, PbRangeResponse};
use latchkey_shared::lifecycle::Lifecycle;
use latchkey_shared::tls::ClientTls;
use latchkey_shared::ApiError;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Makes the client of a cell: its channels, the proxies' key, and the
/// tasks that follow its leader and keep the proxy's token for it.
pub struct CellMaker {
    pub request_timeout: Duration,
    pub tls: Option<ClientTls>,
    pub proxy_key: Option<String>,
    pub credentials: Option<Credentials>,
    pub lifecycle: Lifecycle,
}

impl CellMaker {
    pub fn make(&self, endpoints: &[String]) -> Result<Cell, ApiError> {
        let cell: Cell = Arc::new(CellClient::new(
            endpoints,
            self.request_timeout,
            self.tls.as_ref(),
        )?);
        self.start(&cell);
        Ok(cell)
    }

    /// Starts what every cell client needs besides its channels.
    pub fn start(&self, cell: &Cell) {
        cell.own_credentials
            .set_proxy_key(self.proxy_key.as_deref());
        cell.unsettle_identity();
        let tracker = LeaderTracker { cell: cell.clone() };
        self.lifecycle.spawn_owned(|token| tracker.run(token));
        let identity = CellIdentity {
            cell: cell.clone(),
            credentials: self.credentials.clone(),
        };
        self.lifecycle.spawn_owned(|token| identity.run(token));
    }
}

/// The directory as the home cell holds it now (a linearizable read), or
/// `None` when there is none yet.
pub async fn read(home: &Cell) -> Result<Option<Directory>, ApiError> {
    Ok(read_with_revision(home).await?.map(|(d, _)| d))
}

/// [`read`], with the revision the directory was last written at.
pub async fn read_with_revision(home: &Cell) -> Result<Option<(Directory, i64)>, ApiError> {
    let resp: PbRangeResponse = home
        .call(
            Route::Leader,
            Kind::Read,
            RANGE,
            PbRangeRequest {
                key: DIRECTORY_KEY.to_vec(),
                ..Default::default()
            },
        )
        .await?;
    let Some(kv) = resp.kvs.first() else {
        return Ok(None);
    };
    Directory::decode(&kv.value)
        .map(|d| Some((d, kv.mod_revision)))
        .map_err(|e| ApiError::internal(format!("the directory does not decode: {e}")))
}

/// Reads the directory every `every` until `shutdown`.
pub async fn follow(upstream: Arc<Upstream>, every: Duration, shutdown: CancellationToken) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failing = false;
    while shutdown.run_until_cancelled(tick.tick()).await.is_some() {
        match shutdown.run_until_cancelled(upstream.refresh()).await {
            None => return,
            Some(Ok(_)) => failing = false,
            Some(Err(e)) => {
                // Routing goes on by the directory last read.
                if !failing {
                    tracing::warn!(error = %e, "reading the directory of cells");
                }
                failing = true;
            }
        }
    }
}
