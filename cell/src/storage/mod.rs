//! Opening the cell's on-disk state. Key encodings live in [`keys`], the
//! encoding of everything written to disk or sent to a peer in [`codec`].

pub mod codec;
pub mod keys;

use rocksdb::{ColumnFamilyDescriptor, Options, DB};
use std::path::Path;
use std::sync::Arc;

/// Compacts every column family: reclaims the space of purged log entries.
pub fn compact(db: &DB) {
    for name in [keys::CF_LOGS, keys::CF_META] {
        if let Some(cf) = db.cf_handle(name) {
            db.compact_range_cf(cf, None::<&[u8]>, None::<&[u8]>);
        }
    }
}

/// Opens (or creates) the RocksDB that holds the Raft log and vote.
pub fn open(data_dir: &Path) -> Result<Arc<DB>, rocksdb::Error> {
    let mut opts = Options::default();
    opts.create_if_missing(true);
    opts.create_missing_column_families(true);
    // The log is written sequentially and read mostly at its tail; a
    // modest write buffer keeps memory small for many test processes.
    opts.set_write_buffer_size(16 * 1024 * 1024);
    opts.set_max_background_jobs(2);
    let cfs = [keys::CF_LOGS, keys::CF_META]
        .map(|name| ColumnFamilyDescriptor::new(name, Options::default()));
    let db = DB::open_cf_descriptors(&opts, data_dir.join(keys::RAFT_DB_DIR), cfs)?;
    Ok(Arc::new(db))
}
