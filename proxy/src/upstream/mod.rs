//! The cells behind this proxy, as the proxy sees them ("upstream").
//!
//! - [`cell_client`]: [`CellClient`], channels to one cell's members and
//!   the one place a forwarded call is routed, timed and retried (by the
//!   error's retry class only).
//! - [`leader_tracker`]: [`LeaderTracker`], one task per cell that learns
//!   member ids, the leader and which members are up.
//! - [`identity`]: [`CellIdentity`], one task per cell that learns whether
//!   it has authentication on and keeps the proxy's own token fresh.
//! - [`cell_tokens`]: one client token with a part for each cell.
//! - [`accepted_tokens`]: the client tokens a cell accepted, with their
//!   users, for what the proxy does per user before it asks the cell.
//! - [`directory`]: [`CellMaker`] and what a proxy does with the directory
//!   of cells (DESIGN section 9): follows it and routes by it.
//!
//! [`Upstream`] holds the cells by name: the home cell (`--cells`, which
//! holds the directory and every key no prefix assigns elsewhere) and the
//! cells the directory names. Callers ask [`Upstream::cell_for`] or
//! [`Upstream::route`] with the keys they serve, and send through
//! [`Upstream::routed`], which routes again once when a cell answers
//! `wrong_cell` (a directory change this proxy had not seen yet).

pub mod accepted_tokens;
pub mod cell_client;
pub mod cell_tokens;
pub mod directory;
pub mod identity;
pub mod leader_tracker;

pub use cell_client::{Cell, CellClient, Kind, Route, Who};
pub use directory::CellMaker;
pub use identity::CellIdentity;
pub use leader_tracker::LeaderTracker;

use crate::metrics_catalog::{DIRECTORY_CELLS, DIRECTORY_VERSION};
use latchkey_shared::directory::{Directory, HOME};
use latchkey_shared::key_range::KeyRange;
use latchkey_shared::{ApiError, ErrorCode};
use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

/// Counts a directory read as done when dropped (however it ended).
struct ReadDone<'a>(&'a std::sync::atomic::AtomicU64);

impl Drop for ReadDone<'_> {
    fn drop(&mut self) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::Release);
    }
}

/// How long a request refused by a cell that the directory still names
/// waits before it is sent again.
const REROUTE_PAUSE: std::time::Duration = std::time::Duration::from_millis(20);

/// The directory this proxy routes by, with a client for each cell it
/// names. Replaced whole on every change.
pub struct Routes {
    pub directory: Directory,
    /// Every cell by name, home included.
    cells: BTreeMap<String, Cell>,
}

pub struct Upstream {
    home: Cell,
    routes: RwLock<Arc<Routes>>,
    /// Makes clients for cells the directory adds; `None` in unit tests
    /// that have no directory.
    maker: Option<CellMaker>,
    /// One directory read at a time.
    refreshing: tokio::sync::Mutex<()>,
    /// Directory reads finished (or failed).
    reads: std::sync::atomic::AtomicU64,
    /// Clients of the other cells, by their endpoints.
    made: std::sync::Mutex<BTreeMap<Vec<String>, Cell>>,
}

impl Upstream {
    /// The home cell alone, until the directory is read.
    pub fn new(home: CellClient, maker: Option<CellMaker>) -> Upstream {
        let home: Cell = Arc::new(home);
        let cells = BTreeMap::from([(HOME.to_string(), home.clone())]);
        Upstream {
            home,
            routes: RwLock::new(Arc::new(Routes {
                directory: Directory::default(),
                cells,
            })),
            maker,
            refreshing: tokio::sync::Mutex::new(()),
            reads: Default::default(),
            made: Default::default(),
        }
    }

    /// Starts the home cell's tasks (leader, identity), as for every cell
    /// the directory adds.
    pub fn start_home(&self) {
        if let Some(maker) = &self.maker {
            maker.start(&self.home);
        }
    }

    /// The directory and cells as they are now.
    pub fn routes(&self) -> Arc<Routes> {
        self.routes.read().expect("routes lock").clone()
    }

    /// The cell that holds `key`.
    pub fn cell_for(&self, key: &[u8]) -> Cell {
        let routes = self.routes();
        routes.cell(routes.directory.owner_of(key))
    }

    /// The revision above which a prefix touching the range `key` ..
    /// `range_end` moved into `cell` (0: none moved in): below it the
    /// prefix's keys were still on their way in, so no answer about the
    /// range from a revision below it is the range's.
    pub fn moved_in_above(&self, cell: &Cell, key: &[u8], range_end: &[u8]) -> i64 {
        let routes = self.routes();
        if routes.directory.floors.is_empty() {
            return 0;
        }
        let Some(name) = routes.name_of(cell) else {
            return 0;
        };
        let range = KeyRange::new(key.to_vec(), range_end.to_vec());
        routes
            .directory
            .floors
            .iter()
            .filter(|f| f.cell == name && range.overlaps(&KeyRange::prefix(&f.prefix)))
            .map(|f| f.revision)
            .max()
            .unwrap_or(0)
    }

    /// The one cell that holds every key of `ranges`, or `cross_cell`.
    pub fn route<'a>(
        &self,
        ranges: impl IntoIterator<Item = &'a KeyRange>,
    ) -> Result<Cell, ApiError> {
        let routes = self.routes();
        let name = routes.directory.route(ranges)?;
        Ok(routes.cell(name))
    }

    /// Sends with `send` to the cell of `ranges`; when that cell answers
    /// `wrong_cell`, reads the directory again and sends again (at once to
    /// the cell a newer directory names; after a short pause to the same
    /// one, which is fenced by a move and will be switched), until the
    /// request timeout. A cell refuses what it does not own before it
    /// applies anything, so sending again never doubles a write.
    pub async fn routed<T, F, Fut>(&self, ranges: &[KeyRange], send: F) -> Result<T, ApiError>
    where
        F: Fn(Cell) -> Fut,
        Fut: std::future::Future<Output = Result<T, ApiError>>,
    {
        let deadline = tokio::time::Instant::now() + self.home.request_timeout;
        loop {
            let seen = self.routes().directory.version;
            match send(self.route(ranges)?).await {
                Err(e) if e.code == ErrorCode::WrongCell => {
                    if tokio::time::Instant::now() >= deadline {
                        return Err(e);
                    }
                    self.refresh().await?;
                    if self.routes().directory.version == seen {
                        tokio::time::sleep(REROUTE_PAUSE).await;
                    }
                }
                other => return other,
            }
        }
    }

    /// The home cell: the directory's, and the one for requests that name
    /// no key (leases, membership, status, auth).
    pub fn home(&self) -> &Cell {
        &self.home
    }

    /// Every cell the directory names, home first.
    pub fn cells(&self) -> Vec<Cell> {
        let routes = self.routes();
        let mut cells = vec![self.home.clone()];
        cells.extend(
            routes
                .cells
                .iter()
                .filter(|(name, _)| name.as_str() != HOME)
                .map(|(_, c)| c.clone()),
        );
        cells
    }

    /// The client of the cell at `endpoints`, made once per set of
    /// endpoints and kept (a directory change uses it before the proxies
    /// route by the directory that names it).
    pub fn client(&self, endpoints: &[String]) -> Result<Cell, ApiError> {
        let mut made = self.made.lock().expect("cell clients lock");
        if let Some(cell) = made.get(endpoints) {
            return Ok(cell.clone());
        }
        let maker = self
            .maker
            .as_ref()
            .ok_or_else(|| ApiError::internal("a directory, but no way to reach its cells"))?;
        let cell = maker.make(endpoints)?;
        made.insert(endpoints.to_vec(), cell.clone());
        Ok(cell)
    }

    /// A client of the cell at `endpoints` for a few calls: it starts no
    /// tasks and nothing keeps it.
    pub fn probe(
        &self,
        endpoints: &[String],
        timeout: std::time::Duration,
    ) -> Result<CellClient, ApiError> {
        let tls = self.maker.as_ref().and_then(|m| m.tls.as_ref());
        CellClient::new(endpoints, timeout, tls)
    }

    /// Reads the directory from the home cell and, when it is newer than
    /// the one routed by, routes by it from now on (making clients for the
    /// cells it adds). Returns the version routed by.
    pub async fn refresh(&self) -> Result<u64, ApiError> {
        let asked = self.reads.load(std::sync::atomic::Ordering::Acquire);
        let _one = self.refreshing.lock().await;
        if self.reads.load(std::sync::atomic::Ordering::Acquire) != asked {
            // A read finished while this call waited: the requests held by
            // a move's pause share it instead of each reading home (one
            // that read too early is refused again and reads again).
            return Ok(self.routes().directory.version);
        }
        let _counted = ReadDone(&self.reads);
        let Some(directory) = directory::read(&self.home).await? else {
            return Ok(self.routes().directory.version);
        };
        let current = self.routes();
        if directory.version <= current.directory.version {
            return Ok(current.directory.version);
        }
        let mut cells = BTreeMap::from([(HOME.to_string(), self.home.clone())]);
        for (name, endpoints) in &directory.cells {
            cells.insert(name.clone(), self.client(endpoints)?);
        }
        let version = directory.version;
        tracing::info!(version, cells = cells.len(), "routing by a new directory");
        metrics::gauge!(DIRECTORY_VERSION.name).set(version as f64);
        metrics::gauge!(DIRECTORY_CELLS.name).set(cells.len() as f64);
        *self.routes.write().expect("routes lock") = Arc::new(Routes { directory, cells });
        Ok(version)
    }

    /// Whether every cell has a known leader that answers.
    pub fn not_ready(&self) -> Option<String> {
        self.cells().iter().find_map(|cell| match cell.leader() {
            None => Some(format!(
                "no leader known for the cell at {}",
                cell.members
                    .iter()
                    .map(|m| m.addr.as_str())
                    .collect::<Vec<_>>()
                    .join(",")
            )),
            Some(i) if !cell.members[i].is_up() => Some(format!(
                "the leader at {} does not answer",
                cell.members[i].addr
            )),
            Some(_) => None,
        })
    }
}

impl Routes {
    /// The client for cell `name`; home for a name it has none for (the
    /// directory names only cells it has clients for, so that is never
    /// the case but for a bug).
    fn cell(&self, name: &str) -> Cell {
        self.cells
            .get(name)
            .or_else(|| self.cells.get(HOME))
            .expect("home is always a cell")
            .clone()
    }

    /// The client of the cell named `name`, if the directory names it.
    pub fn named(&self, name: &str) -> Option<Cell> {
        self.cells.get(name).cloned()
    }

    /// The name the directory gives `cell`, if it names it.
    pub fn name_of(&self, cell: &Cell) -> Option<&str> {
        self.cells
            .iter()
            .find(|(_, c)| Arc::ptr_eq(c, cell))
            .map(|(name, _)| name.as_str())
    }
}
