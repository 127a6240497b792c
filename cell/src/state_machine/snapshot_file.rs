//! `snapshot.bin`: the state machine's image on disk and the one place that
//! replaces it.
//!
//! Snapshots are written by builds (every member, on its own schedule or on
//! Defragment) and by installs (a snapshot sent by the leader), and the two
//! can overlap (cell review A1). So every writer uses its own temp file, and
//! the replacement itself is serialised and refuses to put an older image
//! over a newer one: the file only moves forward in the log. Each time it
//! moves, the [`LogPurger`] learns how far the log may now be deleted.

use crate::raft::log_store::LogPurger;
use crate::raft::{LogId, SnapshotMeta};
use crate::storage::codec::{decode, encode};
use crate::storage::keys::{SNAPSHOT_FILE, SNAPSHOT_TMP_SUFFIX};
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// What `snapshot.bin` holds.
#[derive(Debug, Serialize, Deserialize)]
pub struct SnapshotFile {
    pub meta: SnapshotMeta,
    /// An encoded `StateImage`; also exactly what is sent to followers.
    pub data: Vec<u8>,
}

/// What `snapshot.bin` starts with: a name and the format version, so a
/// file from another format is refused by name instead of misread.
const SNAPSHOT_MAGIC: &[u8; 8] = b"LKSNAP\0\0";
/// The version of [`SnapshotFile`]'s encoding. Bump it on any change to
/// the snapshot's types. Format 2 added each version's place within its
/// revision (cell review M3); format 1 was never released.
const SNAPSHOT_FORMAT: u32 = 2;

pub fn encode_snapshot_file(file: &SnapshotFile) -> std::io::Result<Vec<u8>> {
    let mut bytes = Vec::with_capacity(file.data.len() + 256);
    bytes.extend_from_slice(SNAPSHOT_MAGIC);
    bytes.extend_from_slice(&SNAPSHOT_FORMAT.to_be_bytes());
    bytes.extend(encode(file).map_err(std::io::Error::other)?);
    Ok(bytes)
}

pub fn decode_snapshot_file(bytes: &[u8]) -> std::io::Result<SnapshotFile> {
    let bad = |why: String| std::io::Error::new(std::io::ErrorKind::InvalidData, why);
    let header = SNAPSHOT_MAGIC.len() + 4;
    if bytes.len() < header || &bytes[..SNAPSHOT_MAGIC.len()] != SNAPSHOT_MAGIC {
        return Err(bad(format!("{SNAPSHOT_FILE} is not a latchkey snapshot")));
    }
    let mut version = [0u8; 4];
    version.copy_from_slice(&bytes[SNAPSHOT_MAGIC.len()..header]);
    match u32::from_be_bytes(version) {
        SNAPSHOT_FORMAT => decode(&bytes[header..]).map_err(|e| bad(e.to_string())),
        other => Err(bad(format!(
            "{SNAPSHOT_FILE} has format {other}; this build reads format {SNAPSHOT_FORMAT}"
        ))),
    }
}

/// Reads `snapshot.bin` of `dir`, if there is one.
pub fn read_snapshot_file(dir: &Path) -> std::io::Result<Option<SnapshotFile>> {
    match std::fs::read(dir.join(SNAPSHOT_FILE)) {
        Ok(bytes) => decode_snapshot_file(&bytes).map(Some),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Whether `dir` already holds a state machine snapshot.
pub fn has_snapshot(dir: &Path) -> bool {
    dir.join(SNAPSHOT_FILE).exists()
}

/// Writes `bytes` to `tmp` and syncs it.
fn write_synced(tmp: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut f = std::fs::File::create(tmp)?;
    f.write_all(bytes)?;
    f.sync_all()
}

/// Renames `tmp` over `snapshot.bin` and syncs the directory.
fn move_into_place(dir: &Path, tmp: &Path) -> std::io::Result<()> {
    std::fs::rename(tmp, dir.join(SNAPSHOT_FILE))?;
    std::fs::File::open(dir)?.sync_all()
}

/// Writes the first `snapshot.bin` of a new data directory (a restore),
/// before anything else uses the directory.
pub fn write_first_snapshot(dir: &Path, file: &SnapshotFile) -> std::io::Result<()> {
    let tmp = dir.join(format!("{SNAPSHOT_FILE}.restore{SNAPSHOT_TMP_SUFFIX}"));
    write_synced(&tmp, &encode_snapshot_file(file)?)?;
    move_into_place(dir, &tmp)
}

/// The snapshot file of one data directory, shared by every writer.
pub struct SnapshotDir {
    dir: PathBuf,
    /// The log position of the image on disk; held while replacing it.
    on_disk: Mutex<Option<LogId>>,
    next_tmp: AtomicU64,
    purger: Option<Arc<LogPurger>>,
}

impl SnapshotDir {
    /// The snapshot file of `dir`, whose image is at `on_disk`. Leftover
    /// temp files of a writer that crashed are removed.
    pub fn open(
        dir: &Path,
        on_disk: Option<LogId>,
        purger: Option<Arc<LogPurger>>,
    ) -> std::io::Result<SnapshotDir> {
        for entry in std::fs::read_dir(dir)? {
            let name = entry?.file_name();
            let name = name.to_string_lossy();
            if name.starts_with(SNAPSHOT_FILE) && name.ends_with(SNAPSHOT_TMP_SUFFIX) {
                std::fs::remove_file(dir.join(name.as_ref()))?;
            }
        }
        if let Some(purger) = &purger {
            purger.snapshot_durable(on_disk)?;
        }
        Ok(SnapshotDir {
            dir: dir.to_path_buf(),
            on_disk: Mutex::new(on_disk),
            next_tmp: AtomicU64::new(0),
            purger,
        })
    }

    /// Makes `file` the snapshot on disk unless the one there is at least
    /// as far along the log; returns whether it did. Blocking: call it off
    /// the async runtime.
    pub fn replace(&self, file: &SnapshotFile) -> std::io::Result<bool> {
        let at = file.meta.last_log_id;
        if self.current() >= at {
            return Ok(false);
        }
        let seq = self.next_tmp.fetch_add(1, Ordering::Relaxed);
        let tmp = self
            .dir
            .join(format!("{SNAPSHOT_FILE}.{seq}{SNAPSHOT_TMP_SUFFIX}"));
        let written = write_synced(&tmp, &encode_snapshot_file(file)?);
        let mut on_disk = self.on_disk.lock().unwrap_or_else(|e| e.into_inner());
        let moved = match written {
            Ok(()) if *on_disk < at => move_into_place(&self.dir, &tmp).map(|()| true),
            Ok(()) => Ok(false),
            Err(e) => Err(e),
        };
        if !matches!(moved, Ok(true)) {
            let _ = std::fs::remove_file(&tmp);
            return moved;
        }
        *on_disk = at;
        drop(on_disk);
        if let Some(purger) = &self.purger {
            purger.snapshot_durable(at)?;
        }
        Ok(true)
    }

    /// The log position of the image on disk.
    pub fn current(&self) -> Option<LogId> {
        *self.on_disk.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn path(&self) -> &Path {
        &self.dir
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file_at(index: u64) -> SnapshotFile {
        SnapshotFile {
            meta: SnapshotMeta {
                last_log_id: Some(LogId::new(openraft::CommittedLeaderId::new(1, 1), index)),
                snapshot_id: format!("at-{index}"),
                ..Default::default()
            },
            data: index.to_be_bytes().to_vec(),
        }
    }

    #[test]
    fn a_snapshot_file_carries_its_format_and_refuses_others() {
        let file = SnapshotFile {
            meta: SnapshotMeta::default(),
            data: b"image".to_vec(),
        };
        let bytes = encode_snapshot_file(&file).expect("encode");
        assert!(bytes.starts_with(SNAPSHOT_MAGIC));
        assert_eq!(decode_snapshot_file(&bytes).expect("decode").data, b"image");
        let mut other = bytes.clone();
        other[SNAPSHOT_MAGIC.len()..SNAPSHOT_MAGIC.len() + 4].copy_from_slice(&1u32.to_be_bytes());
        let err = decode_snapshot_file(&other).expect_err("format 1 is refused");
        assert!(err.to_string().contains("format 1"), "{err}");
        assert!(decode_snapshot_file(&encode(&file).expect("bare")).is_err());
    }

    /// A1 (cell review): a build that started before an install finished
    /// after it and put its older image over the installed one.
    #[test]
    fn a1_an_older_snapshot_never_replaces_a_newer_one() {
        let dir = tempfile::tempdir().expect("temp dir");
        let files = SnapshotDir::open(dir.path(), None, None).expect("open");
        assert!(files.replace(&file_at(500)).expect("install"));
        assert!(!files.replace(&file_at(100)).expect("a late build"));
        assert!(!files.replace(&file_at(500)).expect("the same again"));
        let on_disk = read_snapshot_file(dir.path())
            .expect("read")
            .expect("a file");
        assert_eq!(on_disk.meta.snapshot_id, "at-500");
        assert!(files.replace(&file_at(501)).expect("newer"));
        assert_eq!(files.current().map(|l| l.index), Some(501));
    }

    /// A1: writers racing on one temp file could mix their bytes. With a
    /// temp file each, whatever the interleaving, the newest image wins
    /// whole and no temp file is left behind.
    #[test]
    fn a1_concurrent_writers_leave_the_newest_whole_image() {
        let dir = tempfile::tempdir().expect("temp dir");
        let files = Arc::new(SnapshotDir::open(dir.path(), None, None).expect("open"));
        let writers: Vec<_> = (1..=8u64)
            .map(|i| {
                let files = files.clone();
                std::thread::spawn(move || {
                    for round in 0..20u64 {
                        files.replace(&file_at(round * 8 + i)).expect("replace");
                    }
                })
            })
            .collect();
        for w in writers {
            w.join().expect("writer");
        }
        let on_disk = read_snapshot_file(dir.path())
            .expect("read")
            .expect("a file");
        assert_eq!(on_disk.meta.snapshot_id, "at-160");
        assert_eq!(on_disk.data, 160u64.to_be_bytes());
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .expect("list")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(left, [std::ffi::OsString::from(SNAPSHOT_FILE)]);
    }
}
