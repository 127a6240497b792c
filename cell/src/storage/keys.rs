//! Every RocksDB column family and key encoding of the cell, in one file.

/// Raft log entries, keyed by [`log_key`].
pub const CF_LOGS: &str = "logs";
/// Small records: vote, committed log id, last purged log id, node id.
pub const CF_META: &str = "meta";

pub const META_VOTE: &[u8] = b"vote";
pub const META_COMMITTED: &[u8] = b"committed";
pub const META_LAST_PURGED: &[u8] = b"last_purged";
pub const META_NODE_ID: &[u8] = b"node_id";
pub const META_CLUSTER_ID: &[u8] = b"cluster_id";

/// Log index as 8 big-endian bytes, so RocksDB's byte order is log order.
pub fn log_key(index: u64) -> [u8; 8] {
    index.to_be_bytes()
}

pub fn decode_log_index(key: &[u8]) -> Option<u64> {
    <[u8; 8]>::try_from(key).ok().map(u64::from_be_bytes)
}

/// The state machine snapshot file inside the data directory.
pub const SNAPSHOT_FILE: &str = "snapshot.bin";
/// How the temp files end that a snapshot is written to before it
/// atomically replaces the old one (`snapshot.bin.<n>.tmp`).
pub const SNAPSHOT_TMP_SUFFIX: &str = ".tmp";
/// The RocksDB directory inside the data directory.
pub const RAFT_DB_DIR: &str = "raft";

#[cfg(test)]
mod tests {
    #[test]
    fn log_keys_sort_in_index_order() {
        let mut keys: Vec<_> = [300u64, 2, 70_000, 1]
            .iter()
            .map(|i| super::log_key(*i))
            .collect();
        keys.sort();
        let back: Vec<_> = keys
            .iter()
            .filter_map(|k| super::decode_log_index(k))
            .collect();
        assert_eq!(back, vec![1, 2, 300, 70_000]);
    }
}
