//! `snapshot.bin`: the state machine's image on disk and the one place that
//! replaces it.
//!
//! Snapshots are written by builds (every member, on its own schedule or on
//! Defragment) and by installs (a snapshot sent by the leader), and the two
//! can overlap (cell review A1). So every writer uses its own temp file, and
//! the replacement itself is serialised and refuses to put an older image
//! over a newer one: the file only moves forward in the log. Each time it
//! moves, the [`LogPurger`] learns how far the log may now be deleted.

use crate::raft::log_purger::LogPurger;
use crate::raft::snapshot_data::SnapshotData;
use crate::raft::{LogId, SnapshotMeta};
use crate::storage::codec::{decode, encode};
use crate::storage::keys::{SNAPSHOT_FILE, SNAPSHOT_TMP_SUFFIX};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// A snapshot to write: what it covers and its encoded `StateImage`
/// (exactly what followers are sent).
#[derive(Debug)]
pub struct SnapshotFile {
    pub meta: SnapshotMeta,
    pub data: Vec<u8>,
}

/// What `snapshot.bin` starts with: a name and the format version, so a
/// file from another format is refused by name instead of misread.
const SNAPSHOT_MAGIC: &[u8; 8] = b"LKSNAP\0\0";
/// The layout of `snapshot.bin`: the magic, this version (4 bytes), the
/// length of the encoded meta (8 bytes), the meta, then the image as it is
/// sent, so the image can be streamed from the file without decoding it.
/// Bump it on any change to the layout or the snapshot's types. Format 2
/// added each version's sub-revision (cell review M3) and the raw image;
/// format 1 was never released.
const SNAPSHOT_FORMAT: u32 = 2;
const FIXED_HEADER: usize = SNAPSHOT_MAGIC.len() + 4 + 8;

fn bad(why: String) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, why)
}

/// The bytes before the image.
fn encode_header(meta: &SnapshotMeta) -> std::io::Result<Vec<u8>> {
    let meta = encode(meta).map_err(std::io::Error::other)?;
    let mut bytes = Vec::with_capacity(FIXED_HEADER + meta.len());
    bytes.extend_from_slice(SNAPSHOT_MAGIC);
    bytes.extend_from_slice(&SNAPSHOT_FORMAT.to_be_bytes());
    bytes.extend_from_slice(&(meta.len() as u64).to_be_bytes());
    bytes.extend(meta);
    Ok(bytes)
}

/// Checks the fixed header; the length of the encoded meta after it.
fn check_fixed_header(bytes: &[u8]) -> std::io::Result<u64> {
    if bytes.len() < FIXED_HEADER || &bytes[..SNAPSHOT_MAGIC.len()] != SNAPSHOT_MAGIC {
        return Err(bad(format!("{SNAPSHOT_FILE} is not a latchkey snapshot")));
    }
    let field = |at: usize, len: usize| {
        let mut b = [0u8; 8];
        b[8 - len..].copy_from_slice(&bytes[at..at + len]);
        u64::from_be_bytes(b)
    };
    match field(SNAPSHOT_MAGIC.len(), 4) as u32 {
        SNAPSHOT_FORMAT => Ok(field(SNAPSHOT_MAGIC.len() + 4, 8)),
        other => Err(bad(format!(
            "{SNAPSHOT_FILE} has format {other}; this build reads format {SNAPSHOT_FORMAT}"
        ))),
    }
}

/// The meta of a snapshot file and where its image starts.
fn read_header(file: &mut std::fs::File) -> std::io::Result<(SnapshotMeta, u64)> {
    use std::io::Read;
    let mut fixed = [0u8; FIXED_HEADER];
    file.read_exact(&mut fixed)
        .map_err(|e| bad(format!("{SNAPSHOT_FILE} is truncated: {e}")))?;
    let meta_len = check_fixed_header(&fixed)?;
    if meta_len > 64 * 1024 * 1024 {
        return Err(bad(format!("{SNAPSHOT_FILE}: a meta of {meta_len} bytes")));
    }
    let mut meta = vec![0u8; meta_len as usize];
    file.read_exact(&mut meta)
        .map_err(|e| bad(format!("{SNAPSHOT_FILE} is truncated: {e}")))?;
    let meta = decode(&meta).map_err(|e| bad(e.to_string()))?;
    Ok((meta, FIXED_HEADER as u64 + meta_len))
}

/// Opens `snapshot.bin` of `dir`, if there is one: its meta and the file
/// positioned at its image.
fn open_snapshot_file(dir: &Path) -> std::io::Result<Option<(SnapshotMeta, std::fs::File, u64)>> {
    match std::fs::File::open(dir.join(SNAPSHOT_FILE)) {
        Ok(mut file) => {
            let (meta, base) = read_header(&mut file)?;
            Ok(Some((meta, file, base)))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Reads `snapshot.bin` of `dir` whole, if there is one.
pub fn read_snapshot_file(dir: &Path) -> std::io::Result<Option<SnapshotFile>> {
    use std::io::Read;
    let Some((meta, mut file, _)) = open_snapshot_file(dir)? else {
        return Ok(None);
    };
    let mut data = Vec::new();
    file.read_to_end(&mut data)?;
    Ok(Some(SnapshotFile { meta, data }))
}

/// The snapshot on disk in `dir` as openraft sends it: its meta, and its
/// image streamed from the file. Costs a header read, whatever its size.
pub fn open_snapshot(dir: &Path) -> std::io::Result<Option<(SnapshotMeta, SnapshotData)>> {
    match open_snapshot_file(dir)? {
        Some((meta, file, base)) => Ok(Some((meta, SnapshotData::new(file, base)?))),
        None => Ok(None),
    }
}

/// Somewhere to receive a snapshot from the leader: an unnamed temp file in
/// `dir` (gone when dropped, even after a crash).
pub fn receiving_snapshot(dir: &Path) -> std::io::Result<SnapshotData> {
    SnapshotData::new(tempfile::tempfile_in(dir)?, 0)
}

/// Whether `dir` already holds a state machine snapshot.
pub fn has_snapshot(dir: &Path) -> bool {
    dir.join(SNAPSHOT_FILE).exists()
}

/// Writes `file` to `tmp` and syncs it.
fn write_synced(tmp: &Path, file: &SnapshotFile) -> std::io::Result<()> {
    let mut f = std::fs::File::create(tmp)?;
    f.write_all(&encode_header(&file.meta)?)?;
    f.write_all(&file.data)?;
    f.sync_all()
}

/// Renames `tmp` over `snapshot.bin` and syncs the directory.
fn move_into_place(dir: &Path, tmp: &Path) -> std::io::Result<()> {
    crate::crash_point!(crate::chaos::SNAPSHOT_BEFORE_RENAME);
    std::fs::rename(tmp, dir.join(SNAPSHOT_FILE))?;
    std::fs::File::open(dir)?.sync_all()
}

/// Writes the first `snapshot.bin` of a new data directory (a restore),
/// before anything else uses the directory.
pub fn write_first_snapshot(dir: &Path, file: &SnapshotFile) -> std::io::Result<()> {
    let tmp = dir.join(format!("{SNAPSHOT_FILE}.restore{SNAPSHOT_TMP_SUFFIX}"));
    write_synced(&tmp, file)?;
    move_into_place(dir, &tmp)
}

/// The snapshot file of one data directory, shared by every writer.
pub struct SnapshotDir {
    dir: PathBuf,
    /// The log position of the image on disk (`None`: no file yet); held
    /// while replacing it.
    on_disk: Mutex<Option<Option<LogId>>>,
    next_tmp: AtomicU64,
    purger: Option<Arc<LogPurger>>,
}

impl SnapshotDir {
    /// The snapshot file of `dir`, whose image is at `on_disk` (`None`: no
    /// file). Leftover temp files of a writer that crashed are removed.
    pub fn open(
        dir: &Path,
        on_disk: Option<Option<LogId>>,
        purger: Option<Arc<LogPurger>>,
    ) -> std::io::Result<SnapshotDir> {
        for entry in std::fs::read_dir(dir)? {
            let name = entry?.file_name();
            let name = name.to_string_lossy();
            if name.starts_with(SNAPSHOT_FILE) && name.ends_with(SNAPSHOT_TMP_SUFFIX) {
                std::fs::remove_file(dir.join(name.as_ref()))?;
            }
        }
        if let (Some(purger), Some(at)) = (&purger, on_disk) {
            purger.snapshot_durable(at)?;
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
        // No file yet, or an older one.
        let behind = |on_disk: Option<Option<LogId>>| on_disk.is_none_or(|d| d < at);
        if !behind(self.current()) {
            return Ok(false);
        }
        let seq = self.next_tmp.fetch_add(1, Ordering::Relaxed);
        let tmp = self
            .dir
            .join(format!("{SNAPSHOT_FILE}.{seq}{SNAPSHOT_TMP_SUFFIX}"));
        let written = write_synced(&tmp, file);
        let mut on_disk = self.on_disk.lock().unwrap_or_else(|e| e.into_inner());
        let moved = match written {
            Ok(()) if behind(*on_disk) => move_into_place(&self.dir, &tmp).map(|()| true),
            Ok(()) => Ok(false),
            Err(e) => Err(e),
        };
        if !matches!(moved, Ok(true)) {
            let _ = std::fs::remove_file(&tmp);
            return moved;
        }
        *on_disk = Some(at);
        drop(on_disk);
        if let Some(purger) = &self.purger {
            purger.snapshot_durable(at)?;
        }
        Ok(true)
    }

    /// The log position of the image on disk (`None`: no file).
    pub fn current(&self) -> Option<Option<LogId>> {
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
        let dir = tempfile::tempdir().expect("temp dir");
        let files = SnapshotDir::open(dir.path(), None, None).expect("open");
        files.replace(&file_at(7)).expect("write");
        let bytes = std::fs::read(dir.path().join(SNAPSHOT_FILE)).expect("read");
        assert!(bytes.starts_with(SNAPSHOT_MAGIC));
        let back = read_snapshot_file(dir.path())
            .expect("read")
            .expect("a file");
        assert_eq!(back.meta.snapshot_id, "at-7");
        assert_eq!(back.data, 7u64.to_be_bytes());
        let mut other = bytes.clone();
        other[SNAPSHOT_MAGIC.len()..SNAPSHOT_MAGIC.len() + 4].copy_from_slice(&1u32.to_be_bytes());
        std::fs::write(dir.path().join(SNAPSHOT_FILE), &other).expect("write");
        let err = read_snapshot_file(dir.path()).expect_err("format 1 is refused");
        assert!(err.to_string().contains("format 1"), "{err}");
        std::fs::write(dir.path().join(SNAPSHOT_FILE), &bytes[..10]).expect("write");
        assert!(read_snapshot_file(dir.path()).is_err(), "a truncated file");
    }

    /// The image openraft streams to a follower is the image on disk,
    /// read from the file, not decoded.
    #[tokio::test]
    async fn the_current_snapshot_streams_its_image_from_the_file() {
        let dir = tempfile::tempdir().expect("temp dir");
        let files = SnapshotDir::open(dir.path(), None, None).expect("open");
        assert!(open_snapshot(dir.path()).expect("none yet").is_none());
        files.replace(&file_at(9)).expect("write");
        let (meta, mut data) = open_snapshot(dir.path()).expect("open").expect("a file");
        assert_eq!(meta.snapshot_id, "at-9");
        assert_eq!(data.read_all().await.expect("image"), 9u64.to_be_bytes());
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
        assert_eq!(files.current().flatten().map(|l| l.index), Some(501));
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
