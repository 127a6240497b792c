//! [`CellCoalescers`]: one [`Coalescer`] per cell. A client watch joins
//! the shared watches of the cell that owns every key of its range (the
//! directory of cells decides, [`Upstream::route`]); a watch over keys of
//! two cells is refused with `cross_cell`. Each cell has its own
//! revisions: a watch's events and progress carry its cell's.

use super::coalescer::Coalescer;
use crate::upstream::{Cell, Upstream};
use latchkey_shared::key_range::KeyRange;
use latchkey_shared::ApiError;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

pub struct CellCoalescers {
    home: Arc<Coalescer>,
    /// The other cells', by their members' addresses, made on first use
    /// and kept (the proxy keeps every cell's client too).
    others: Mutex<HashMap<Vec<String>, Arc<Coalescer>>>,
    history_len: usize,
    queue_len: usize,
    queue_bytes: usize,
}

impl CellCoalescers {
    pub fn new(home: &Cell, history_len: usize, queue_len: usize, queue_bytes: usize) -> Self {
        CellCoalescers {
            home: Coalescer::new(home.clone(), history_len, queue_len, queue_bytes),
            others: Mutex::new(HashMap::new()),
            history_len,
            queue_len,
            queue_bytes,
        }
    }

    /// The home cell's (the read cache's too).
    pub fn home(&self) -> &Arc<Coalescer> {
        &self.home
    }

    /// The coalescer of `cell`.
    pub fn of(&self, upstream: &Upstream, cell: &Cell) -> Arc<Coalescer> {
        if Arc::ptr_eq(cell, upstream.home()) {
            return self.home.clone();
        }
        let addrs: Vec<String> = cell.members.iter().map(|m| m.addr.clone()).collect();
        let mut others = self.others.lock().unwrap_or_else(|p| p.into_inner());
        others
            .entry(addrs)
            .or_insert_with(|| {
                Coalescer::new(
                    cell.clone(),
                    self.history_len,
                    self.queue_len,
                    self.queue_bytes,
                )
            })
            .clone()
    }

    /// The coalescer of the one cell that owns every key of `range`.
    pub fn for_range(
        &self,
        upstream: &Upstream,
        range: &KeyRange,
    ) -> Result<Arc<Coalescer>, ApiError> {
        let cell = upstream.route([range])?;
        Ok(self.of(upstream, &cell))
    }
}
