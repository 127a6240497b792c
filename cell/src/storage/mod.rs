//! Opening the cell's on-disk state. Key encodings live in [`keys`], the
//! encoding of everything written to disk or sent to a peer in [`codec`].

pub mod codec;
pub mod keys;

use codec::decode;
use rocksdb::{ColumnFamilyDescriptor, Options, WriteOptions, DB};
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

/// Bytes the log store holds, on disk and in memory tables: what etcd's
/// Status reports as the database size (the keyspace itself lives in
/// memory and in snapshots; its size is the "in use" figure).
pub fn stored_bytes(db: &DB) -> u64 {
    let mut total = 0;
    for name in [keys::CF_LOGS, keys::CF_META] {
        if let Some(cf) = db.cf_handle(name) {
            for property in [
                "rocksdb.total-sst-files-size",
                "rocksdb.cur-size-all-mem-tables",
            ] {
                total += db
                    .property_int_value_cf(cf, property)
                    .ok()
                    .flatten()
                    .unwrap_or(0);
            }
        }
    }
    total
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

/// Write options for the rare writes that must be on disk when they
/// return (votes, truncations, purges, identity).
pub fn sync_opts() -> WriteOptions {
    let mut o = WriteOptions::default();
    o.set_sync(true);
    o
}

pub fn io_err(e: impl std::error::Error + Send + Sync + 'static) -> std::io::Error {
    std::io::Error::other(e)
}

/// A record of the meta column family, decoded.
pub fn read_meta<T: serde::de::DeserializeOwned>(
    db: &DB,
    key: &[u8],
) -> std::io::Result<Option<T>> {
    let cf = db
        .cf_handle(keys::CF_META)
        .expect("column family created at open");
    match db.get_cf(cf, key).map_err(io_err)? {
        None => Ok(None),
        Some(b) => decode(&b).map(Some).map_err(io_err),
    }
}
