//! Opening the cell's on-disk state. Key encodings live in [`keys`], the
//! encoding of everything written to disk or sent to a peer in [`codec`].

pub mod codec;
pub mod keys;

use codec::decode;
use rocksdb::{BlockBasedOptions, Cache, ColumnFamilyDescriptor, Options, WriteOptions, DB};
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
    summed(
        db,
        &[
            "rocksdb.total-sst-files-size",
            "rocksdb.cur-size-all-mem-tables",
        ],
    )
}

/// The sum of integer `properties` over every column family.
fn summed(db: &DB, properties: &[&str]) -> u64 {
    let mut total = 0;
    for name in [keys::CF_LOGS, keys::CF_META] {
        if let Some(cf) = db.cf_handle(name) {
            for property in properties {
                total += db
                    .property_int_value_cf(cf, *property)
                    .ok()
                    .flatten()
                    .unwrap_or(0);
            }
        }
    }
    total
}

/// Bytes the log store holds in memory: its memory tables (written and
/// not yet flushed) and its block cache. A member's memory beyond this and
/// the keyspace is the process's own.
pub fn memory_bytes(db: &DB) -> u64 {
    summed(db, &["rocksdb.size-all-mem-tables"]) + block_cache().get_usage() as u64
}

/// Opens (or creates) the RocksDB that holds the Raft log and vote.
pub fn open(data_dir: &Path) -> Result<Arc<DB>, rocksdb::Error> {
    let mut opts = column_family_options();
    opts.create_if_missing(true);
    opts.create_missing_column_families(true);
    opts.set_max_background_jobs(2);
    // All memory tables together, whatever each column family's own size.
    opts.set_db_write_buffer_size(MEMTABLES_BYTES);
    let cfs = [keys::CF_LOGS, keys::CF_META]
        .map(|name| ColumnFamilyDescriptor::new(name, column_family_options()));
    let db = DB::open_cf_descriptors(&opts, data_dir.join(keys::RAFT_DB_DIR), cfs)?;
    Ok(Arc::new(db))
}

/// Bytes a column family's memory table takes before it is written out.
/// The log is written sequentially and read mostly at its tail (entries
/// not yet applied, a lagging follower's), so a small table costs nothing
/// but more, smaller files, which compaction merges.
const MEMTABLE_BYTES: usize = 8 << 20;

/// Bytes all memory tables take together before the largest is written
/// out.
const MEMTABLES_BYTES: usize = 16 << 20;

/// Bytes of the block cache: reads of the log past its memory tables
/// (a lagging follower's catch-up, a restart's replay).
const BLOCK_CACHE_BYTES: usize = 8 << 20;

/// Options of every column family. Each family has options of its own:
/// RocksDB's defaults (64 MiB memory tables, two of them per family) held
/// more of a member's memory than its whole keyspace.
fn column_family_options() -> Options {
    let mut o = Options::default();
    o.set_write_buffer_size(MEMTABLE_BYTES);
    o.set_max_write_buffer_number(2);
    let mut table = BlockBasedOptions::default();
    table.set_block_cache(&block_cache());
    o.set_block_based_table_factory(&table);
    o
}

/// One block cache shared by every column family of the process.
fn block_cache() -> Cache {
    static CACHE: std::sync::OnceLock<Cache> = std::sync::OnceLock::new();
    CACHE
        .get_or_init(|| Cache::new_lru_cache(BLOCK_CACHE_BYTES))
        .clone()
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
