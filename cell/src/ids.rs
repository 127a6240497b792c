//! Ids every member must compute alike: the cell id and new member ids,
//! from FNV-1a (fixed across builds and machines, unlike std's hasher).

use std::collections::BTreeMap;

/// FNV-1a's offset basis: where a fresh hash starts.
pub const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

/// Folds `bytes` into the FNV-1a hash `h`: fixed across builds and
/// machines, unlike std's hasher, so every member computes the same ids.
pub fn fnv1a(mut h: u64, bytes: impl IntoIterator<Item = u8>) -> u64 {
    for b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// A stable id for the cell: a hash of its initial membership, the same on
/// every member.
pub fn cluster_id(members: &BTreeMap<u64, String>) -> u64 {
    members.iter().fold(FNV_OFFSET, |h, (id, addr)| {
        fnv1a(h, format!("{id}={addr};").bytes())
    })
}

/// The id of a cell restored from a state file: its members' id mixed with
/// the file's digest, so members given different files (or one given none)
/// belong to different cells and refuse each other's Raft messages.
pub fn restored_cluster_id(cluster_id: u64, state_file_digest: &[u8]) -> u64 {
    fnv1a(cluster_id, state_file_digest.iter().copied())
}

/// A fresh member id: a hash of the address and the time, never one in use
/// (etcd derives its member ids the same way).
pub fn new_member_id(peer_addr: &str, taken: impl Fn(u64) -> bool) -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let mut h = FNV_OFFSET ^ nanos;
    loop {
        h = fnv1a(h, peer_addr.bytes().chain(nanos.to_le_bytes()));
        // Ids stay below 2^63 so tools that parse them as signed agree.
        let id = h & (i64::MAX as u64);
        if id != 0 && !taken(id) {
            return id;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_member_ids_avoid_ids_in_use() {
        let first = new_member_id("h:1", |_| false);
        let second = new_member_id("h:1", |id| id == first);
        assert_ne!(first, 0);
        assert_ne!(first, second);
        assert!(second <= i64::MAX as u64);
    }

    #[test]
    fn the_cluster_id_is_the_same_for_the_same_membership() {
        let a = BTreeMap::from([(1, "h:1".to_string()), (2, "h:2".to_string())]);
        let b = BTreeMap::from([(2, "h:2".to_string()), (1, "h:1".to_string())]);
        assert_eq!(cluster_id(&a), cluster_id(&b));
        let c = BTreeMap::from([(1, "h:1".to_string()), (2, "h:3".to_string())]);
        assert_ne!(cluster_id(&a), cluster_id(&c));
    }
}
