//! The directory of cells (DESIGN section 9): which cell owns which key
//! prefix, and what each cell is told it owns.
//!
//! - [`Directory`] lives in the home cell (the one every proxy is started
//!   with) at [`DIRECTORY_KEY`], as JSON. Every change is a new version.
//!   A key under no assigned prefix belongs to the home cell, so a proxy
//!   with no directory, or an empty one, serves one cell as before.
//! - [`Ownership`] lives in each cell at [`OWNERSHIP_KEY`]: what that cell
//!   accepts. A cell applies a write, and answers a read or a watch, only
//!   for keys it owns, checked where it applies writes, so a request routed
//!   by a proxy that has not seen the newest directory is refused with
//!   `wrong_cell` instead of applied in the wrong cell. A cell without the
//!   record owns every key. Its own records (under the reserved prefix) are
//!   always its own.
//!
//! A change moves ownership in this order: every cell that loses keys is
//! told first, then the cell that gains them, then the directory. Between
//! the steps some keys are owned by no cell (refused, retried), never by
//! two.

use crate::key_range::{is_reserved, prefix_end, KeyRange};
use crate::ApiError;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// Where the directory lives, in the home cell.
pub const DIRECTORY_KEY: &[u8] = b"\0latchkey/directory";
/// Held (on a lease) while one directory change runs, so that two changes
/// never interleave their ownership records.
pub const CHANGE_KEY: &[u8] = b"\0latchkey/directory-change";
/// Where each cell keeps what it owns.
pub const OWNERSHIP_KEY: &[u8] = b"\0latchkey/ownership";
/// In the home cell, one key per session and cell the session was extended
/// to (`<prefix><lease id, 16 hex digits>/<cell>`), bound to the session's
/// lease: any proxy that takes the session over learns where to refresh it,
/// and the records go with the session.
pub const SESSION_CELLS_PREFIX: &[u8] = b"\0latchkey/session-cells/";

/// How a cell's refusal of keys it does not own ends, in an error's
/// message and in the reason a watch of such keys is cancelled with (a
/// watch cancel carries no error code): [`moved_away`] recognises it.
pub const ROUTED_ELSEWHERE: &str = "the directory routes them to another cell; nothing was applied";

/// Whether a watch's cancel `reason` says its cell stopped owning the keys
/// (a move took them elsewhere): its watcher reads again, through the
/// directory, and watches on in the keys' new cell.
pub fn moved_away(reason: &str) -> bool {
    reason.ends_with(ROUTED_ELSEWHERE)
}

/// The record that session `lease` was extended to cell `cell`.
pub fn session_cell_key(lease: i64, cell: &str) -> Vec<u8> {
    [session_cells_of(lease).as_slice(), cell.as_bytes()].concat()
}

/// The prefix of session `lease`'s records.
pub fn session_cells_of(lease: i64) -> Vec<u8> {
    [SESSION_CELLS_PREFIX, format!("{lease:016x}/").as_bytes()].concat()
}

/// The name of the cell that holds the directory and every unassigned key.
pub const HOME: &str = "home";

/// Longest cell name.
pub const MAX_NAME_CHARS: usize = 64;
/// Longest assigned prefix.
pub const MAX_PREFIX_BYTES: usize = 1024;
/// Most assigned prefixes.
pub const MAX_PREFIXES: usize = 4096;
/// Most cells besides home.
pub const MAX_CELLS: usize = 64;

/// One prefix and the cell that owns it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Assignment {
    pub prefix: Vec<u8>,
    pub cell: String,
}

/// The directory, as stored.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Directory {
    /// Raised by every change; 0 before the first.
    pub version: u64,
    /// The cells besides home, by name: their members' client addresses.
    pub cells: BTreeMap<String, Vec<String>>,
    /// Assigned prefixes, sorted, none a prefix of another. A key under
    /// none of them is home's.
    pub prefixes: Vec<Assignment>,
    /// Where moved prefixes' revisions start in the cells they moved to.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub floors: Vec<Floor>,
}

/// A prefix moved into `cell` when its revision was raised above
/// `revision`: revisions up to it are the old cell's, so a read or watch of
/// the prefix there at one of them is refused as compacted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Floor {
    pub prefix: Vec<u8>,
    pub cell: String,
    pub revision: i64,
}

/// What one cell owns, as stored in that cell.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ownership {
    /// The directory version this record was written for.
    pub version: u64,
    /// `true`: every key except those under `prefixes` (the home cell);
    /// `false`: only the keys under `prefixes`.
    pub rest: bool,
    pub prefixes: Vec<Vec<u8>>,
    /// Prefixes it still owns but takes no writes for: it is losing them,
    /// and the change that moves them reads what they hold first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub leaving: Vec<Vec<u8>>,
    /// Prefixes (among its own) a move is bringing in: only the proxies,
    /// which copy them, read or write them until the move commits.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub arriving: Vec<Vec<u8>>,
    /// Prefixes it gave away: applying this record deletes every key under
    /// them (what is left of a prefix moved out), telling no watcher.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dropped: Vec<Vec<u8>>,
    /// Its moved-in prefixes' floors ([`Floor`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub floors: Vec<(Vec<u8>, i64)>,
}

fn show(bytes: &[u8]) -> String {
    bytes.escape_ascii().to_string()
}

impl Directory {
    pub fn decode(value: &[u8]) -> Result<Directory, serde_json::Error> {
        serde_json::from_slice(value)
    }

    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a directory serialises")
    }

    /// Whether `name` is a cell of this directory (home always is).
    pub fn has_cell(&self, name: &str) -> bool {
        name == HOME || self.cells.contains_key(name)
    }

    /// The cell that owns `key`. Reserved keys are each cell's own; a
    /// client reads home's.
    pub fn owner_of(&self, key: &[u8]) -> &str {
        if let Some(name) = key.strip_prefix(crate::lock::delay::RECORD_PREFIX) {
            // A lock's delay record is kept with the lock.
            return self.owner_of(name);
        }
        if is_reserved(key) {
            return HOME;
        }
        // The last assignment whose prefix is not after the key is the only
        // one that can hold it (prefixes never nest).
        let at = self
            .prefixes
            .partition_point(|a| a.prefix.as_slice() <= key);
        match at.checked_sub(1).map(|i| &self.prefixes[i]) {
            Some(a) if key.starts_with(&a.prefix) => &a.cell,
            _ => HOME,
        }
    }

    /// Every cell that owns a key of `range`.
    pub fn cells_of(&self, range: &KeyRange) -> BTreeSet<&str> {
        let mut cells = BTreeSet::new();
        if range.is_empty() {
            cells.insert(HOME);
            return cells;
        }
        if range.end.is_empty() {
            cells.insert(self.owner_of(&range.start));
            return cells;
        }
        if is_reserved(&range.start) {
            // A range that starts inside the reserved prefix reads records;
            // home's are the ones a client sees.
            cells.insert(HOME);
        }
        // Walk the assigned prefixes the range overlaps in order; a gap
        // before, between or after them holds home's keys.
        let mut covered_to: Option<Vec<u8>> = Some(range.start.clone());
        for a in &self.prefixes {
            let p = KeyRange::prefix(&a.prefix);
            if !range.overlaps(&p) {
                continue;
            }
            cells.insert(&a.cell);
            if let Some(c) = &covered_to {
                if p.start.as_slice() > c.as_slice() {
                    cells.insert(HOME);
                }
            }
            let end = prefix_end(&a.prefix);
            covered_to = if end == [0] { None } else { Some(end) };
            // `covered_to` only grows: prefixes are sorted and never nest.
        }
        if let Some(c) = covered_to {
            let keys_after = match range.bounds().1 {
                std::ops::Bound::Unbounded => true,
                std::ops::Bound::Excluded(e) => c.as_slice() < e,
                std::ops::Bound::Included(e) => c.as_slice() <= e,
            };
            if keys_after {
                cells.insert(HOME);
            }
        }
        cells
    }

    /// The one cell that owns every key of `ranges`, or `cross_cell`
    /// naming the cells they span. Ranges of latchkey's own records (a lock
    /// recipe's delay and audit records, an idempotency record) go with
    /// the other keys of the request: every cell keeps its own; alone,
    /// they are home's.
    pub fn route<'a>(
        &self,
        ranges: impl IntoIterator<Item = &'a KeyRange>,
    ) -> Result<&str, ApiError> {
        let mut cells = BTreeSet::new();
        for range in ranges {
            if range.is_empty() {
                continue;
            }
            if !is_reserved(&range.start) {
                cells.extend(self.cells_of(range));
            } else if range.end.is_empty()
                && range.start.starts_with(crate::lock::delay::RECORD_PREFIX)
            {
                cells.insert(self.owner_of(&range.start));
            }
        }
        match cells.len() {
            0 => Ok(HOME),
            1 => Ok(cells.into_iter().next().expect("one cell")),
            _ => Err(ApiError::cross_cell(format!(
                "the request's keys lie in cells {} (directory version {}); a request \
                     is served by one cell: split it by cell",
                cells.into_iter().collect::<Vec<_>>().join(", "),
                self.version
            ))),
        }
    }

    /// What `cell` owns under this directory.
    pub fn ownership_of(&self, cell: &str) -> Ownership {
        let rest = cell == HOME;
        Ownership {
            version: self.version,
            rest,
            leaving: Vec::new(),
            arriving: Vec::new(),
            dropped: Vec::new(),
            floors: self
                .floors
                .iter()
                .filter(|f| f.cell == cell)
                .map(|f| (f.prefix.clone(), f.revision))
                .collect(),
            prefixes: self
                .prefixes
                .iter()
                .filter(|a| (a.cell == cell) != rest)
                .map(|a| a.prefix.clone())
                .collect(),
        }
    }

    /// The directory with `prefix` moved into `cell` above `revision`.
    pub fn with_floor(mut self, prefix: &[u8], cell: &str, revision: i64) -> Directory {
        self.floors.retain(|f| f.prefix != prefix);
        self.floors.push(Floor {
            prefix: prefix.to_vec(),
            cell: cell.to_string(),
            revision,
        });
        self
    }

    /// The directory with cell `name` added, at `endpoints`. Adding a cell
    /// again with the same endpoints changes nothing.
    pub fn with_cell(&self, name: &str, endpoints: Vec<String>) -> Result<Directory, ApiError> {
        check_cell_name(name)?;
        if name == HOME {
            return Err(ApiError::invalid(format!(
                "{HOME:?} is the cell that holds the directory; it has no entry of its own"
            )));
        }
        if endpoints.is_empty() || endpoints.iter().any(|e| e.trim().is_empty()) {
            return Err(ApiError::invalid(format!(
                "cell {name:?}: give its members' client addresses"
            )));
        }
        match self.cells.get(name) {
            Some(have) if *have == endpoints => return Ok(self.clone()),
            Some(have) => {
                return Err(ApiError::precondition_failed(format!(
                    "cell {name:?} exists at {}",
                    have.join(",")
                )))
            }
            None if self.cells.len() >= MAX_CELLS => {
                return Err(ApiError::invalid(format!(
                    "at most {MAX_CELLS} cells besides {HOME:?}"
                )))
            }
            None => {}
        }
        let mut next = self.clone();
        next.version += 1;
        next.cells.insert(name.to_string(), endpoints);
        Ok(next)
    }

    /// The directory with `prefix` owned by `cell` (assigning to home
    /// removes the assignment). `None` when it already is.
    pub fn with_assignment(
        &self,
        prefix: &[u8],
        cell: &str,
    ) -> Result<Option<Directory>, ApiError> {
        check_prefix(prefix)?;
        if !self.has_cell(cell) {
            return Err(ApiError::invalid(format!(
                "no cell {cell:?} in the directory; add it first"
            )));
        }
        if let Some(other) = self.prefixes.iter().find(|a| {
            a.prefix != prefix && (a.prefix.starts_with(prefix) || prefix.starts_with(&a.prefix))
        }) {
            return Err(ApiError::invalid(format!(
                "prefix {:?} nests with {:?} (cell {}); assigned prefixes never nest",
                show(prefix),
                show(&other.prefix),
                other.cell
            )));
        }
        let mut next = self.clone();
        next.prefixes.retain(|a| a.prefix != prefix);
        if cell != HOME {
            if next.prefixes.len() >= MAX_PREFIXES {
                return Err(ApiError::invalid(format!(
                    "at most {MAX_PREFIXES} assigned prefixes"
                )));
            }
            next.prefixes.push(Assignment {
                prefix: prefix.to_vec(),
                cell: cell.to_string(),
            });
            next.prefixes.sort_by(|a, b| a.prefix.cmp(&b.prefix));
        }
        if next.prefixes == self.prefixes {
            return Ok(None);
        }
        next.version += 1;
        Ok(Some(next))
    }
}

impl Ownership {
    pub fn decode(value: &[u8]) -> Result<Ownership, serde_json::Error> {
        serde_json::from_slice(value)
    }

    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("an ownership record serialises")
    }

    /// Owns nothing but its own records: what a cell holds when its record
    /// does not decode (refused, never answered wrongly).
    pub fn nothing() -> Ownership {
        Ownership {
            version: 0,
            rest: false,
            prefixes: Vec::new(),
            leaving: Vec::new(),
            arriving: Vec::new(),
            dropped: Vec::new(),
            floors: Vec::new(),
        }
    }

    /// Whether every key of `range` is this cell's.
    pub fn owns(&self, range: &KeyRange) -> bool {
        if is_reserved(&range.start) || range.is_empty() {
            return true;
        }
        if self.rest {
            !self
                .prefixes
                .iter()
                .any(|p| range.overlaps(&KeyRange::prefix(p)))
        } else {
            self.prefixes.iter().any(|p| within(range, p))
        }
    }

    /// This record with writes under `prefixes` refused from now on.
    pub fn with_leaving(mut self, prefixes: Vec<Vec<u8>>) -> Ownership {
        self.leaving = prefixes;
        self
    }

    /// This record with `prefixes` served to the proxies only (a move is
    /// bringing them in).
    pub fn with_arriving(mut self, prefixes: Vec<Vec<u8>>) -> Ownership {
        self.arriving = prefixes;
        self
    }

    /// `wrong_cell` for a read (or watch) of `range` unless every key of it
    /// is this cell's.
    pub fn check_read(&self, range: &KeyRange) -> Result<(), ApiError> {
        if self.owns(range) {
            return Ok(());
        }
        Err(self.wrong(range))
    }

    /// `wrong_cell` for a write of `range` unless every key of it is this
    /// cell's and none is leaving it or still arriving (a move's own
    /// writes come as imports: [`check_import`](Self::check_import)).
    pub fn check_write(&self, range: &KeyRange) -> Result<(), ApiError> {
        let moving = !is_reserved(&range.start)
            && self
                .leaving
                .iter()
                .chain(&self.arriving)
                .any(|p| range.overlaps(&KeyRange::prefix(p)));
        if self.owns(range) && !moving {
            return Ok(());
        }
        Err(self.wrong(range))
    }

    /// `wrong_cell` for a move's import of `range` (keys, or their
    /// deletion) unless every key of it is this cell's, arriving or not.
    pub fn check_import(&self, range: &KeyRange) -> Result<(), ApiError> {
        if self.owns(range) {
            return Ok(());
        }
        Err(self.wrong(range))
    }

    /// The highest floor of a moved-in prefix `range` touches (0: none).
    pub fn floor(&self, range: &KeyRange) -> i64 {
        self.floors
            .iter()
            .filter(|(p, _)| range.overlaps(&KeyRange::prefix(p)))
            .map(|(_, r)| *r)
            .max()
            .unwrap_or(0)
    }

    /// Refuses `range` to a client (not a proxy) while a move brings keys
    /// of it in.
    pub fn check_not_arriving(&self, range: &KeyRange) -> Result<(), ApiError> {
        let arriving = !is_reserved(&range.start)
            && self
                .arriving
                .iter()
                .any(|p| range.overlaps(&KeyRange::prefix(p)));
        if !arriving {
            return Ok(());
        }
        Err(ApiError::wrong_cell(format!(
            "keys from {:?} are moving into this cell and are not served here until the \
             move commits; send the request through a proxy",
            show(&range.start)
        )))
    }

    fn wrong(&self, range: &KeyRange) -> ApiError {
        ApiError::wrong_cell(format!(
            "keys from {:?} are not in this cell (its directory version {}): {ROUTED_ELSEWHERE}",
            show(&range.start),
            self.version
        ))
    }
}

/// Whether every key of `range` starts with `prefix`.
fn within(range: &KeyRange, prefix: &[u8]) -> bool {
    if !range.start.starts_with(prefix) {
        return false;
    }
    if range.end.is_empty() {
        return true;
    }
    let end = prefix_end(prefix);
    if end == [0] {
        return true;
    }
    range.end != [0] && range.end <= end
}

/// Refuses a cell name that is empty, too long, or not lower-case letters,
/// digits and `-`.
pub fn check_cell_name(name: &str) -> Result<(), ApiError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME_CHARS
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(ApiError::invalid(format!(
            "cell name {:?}: 1 to {MAX_NAME_CHARS} characters of a-z, 0-9 and '-'",
            name.escape_debug().to_string()
        )))
    }
}

/// Refuses a prefix that is empty, too long or reserved.
pub fn check_prefix(prefix: &[u8]) -> Result<(), ApiError> {
    if prefix.is_empty() || prefix.len() > MAX_PREFIX_BYTES {
        return Err(ApiError::invalid(format!(
            "an assigned prefix has 1 to {MAX_PREFIX_BYTES} bytes"
        )));
    }
    if is_reserved(prefix) || crate::key_range::RESERVED_PREFIX.starts_with(prefix) {
        return Err(ApiError::invalid(format!(
            "prefix {:?} holds latchkey's own records, which every cell keeps for itself",
            show(prefix)
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorCode;

    fn two_cells() -> Directory {
        let d = Directory::default()
            .with_cell("b", vec!["127.0.0.1:1".into()])
            .unwrap();
        let d = d.with_assignment(b"jobs/", "b").unwrap().unwrap();
        d.with_assignment(b"queue/", "b").unwrap().unwrap()
    }

    fn range(start: &str, end: &str) -> KeyRange {
        KeyRange::new(start.as_bytes().to_vec(), end.as_bytes().to_vec())
    }

    #[test]
    fn a_refusal_of_keys_moved_away_is_recognised_in_a_watch_cancel_reason() {
        let b = Directory::default().ownership_of("b");
        let refused = b
            .check_read(&KeyRange::prefix(b"jobs/"))
            .expect_err("b owns nothing");
        assert!(moved_away(&refused.message), "{}", refused.message);
        assert!(!moved_away("the watch was cancelled: too many watches"));
    }

    #[test]
    fn a_key_goes_to_the_cell_of_its_prefix_and_every_other_key_home() {
        let d = two_cells();
        assert_eq!(d.version, 3);
        assert_eq!(d.owner_of(b"jobs/1"), "b");
        assert_eq!(d.owner_of(b"jobs/"), "b");
        assert_eq!(d.owner_of(b"jobs"), HOME);
        assert_eq!(d.owner_of(b"queue/x"), "b");
        assert_eq!(d.owner_of(b"a"), HOME);
        assert_eq!(d.owner_of(b"zzz"), HOME);
        assert_eq!(d.owner_of(b"\0latchkey/audit/1"), HOME);
    }

    #[test]
    fn a_range_is_routed_to_one_cell_or_refused_naming_the_cells() {
        let d = two_cells();
        assert_eq!(d.route([&KeyRange::prefix(b"jobs/")]).unwrap(), "b");
        assert_eq!(d.route([&KeyRange::prefix(b"jobs/a/")]).unwrap(), "b");
        assert_eq!(d.route([&range("jobs/a", "jobs/b")]).unwrap(), "b");
        assert_eq!(d.route([&KeyRange::prefix(b"config/")]).unwrap(), HOME);
        // From inside jobs/ to past it, from before it, the whole keyspace.
        for r in [
            range("jobs/a", "k"),
            range("a", "jobs/b"),
            KeyRange::prefix(b""),
        ] {
            let e = d.route([&r]).unwrap_err();
            assert_eq!(e.code, ErrorCode::CrossCell, "{r:?}");
            assert!(e.message.contains("b, home"), "{}", e.message);
        }
        // Two prefixes of b, with no home key between them in the range.
        assert_eq!(
            d.route([
                &KeyRange::prefix(b"jobs/"),
                &KeyRange::single(b"queue/1".to_vec())
            ])
            .unwrap(),
            "b"
        );
        assert!(
            d.route([&range("jobs/", "queue0")]).is_err(),
            "keys between"
        );
        let e = d
            .route([
                &KeyRange::single(b"jobs/1".to_vec()),
                &KeyRange::single(b"x".to_vec()),
            ])
            .unwrap_err();
        assert_eq!(e.code, ErrorCode::CrossCell);
        let record = KeyRange::single(b"\0latchkey/lock-delay/jobs/x".to_vec());
        assert_eq!(
            d.route([&KeyRange::single(b"jobs/x".to_vec()), &record])
                .unwrap(),
            "b",
            "records go with the keys"
        );
        assert_eq!(
            d.route([&record]).unwrap(),
            "b",
            "a lock's delay record is its cell's"
        );
        let audit = KeyRange::single(b"\0latchkey/audit/1".to_vec());
        assert_eq!(d.route([&audit]).unwrap(), HOME);
        let inverted = range("z", "a");
        assert_eq!(
            d.route([&KeyRange::single(b"jobs/x".to_vec()), &inverted])
                .unwrap(),
            "b",
            "an empty range names no cell"
        );
    }

    #[test]
    fn each_cell_owns_what_the_directory_gives_it_and_nothing_else() {
        let d = two_cells();
        let home = d.ownership_of(HOME);
        let b = d.ownership_of("b");
        for (r, home_owns) in [
            (KeyRange::single(b"jobs/1".to_vec()), false),
            (KeyRange::single(b"config".to_vec()), true),
            (KeyRange::prefix(b"jobs/"), false),
            (KeyRange::prefix(b"config/"), true),
            (range("a", "z"), false),
            (KeyRange::prefix(b""), false),
        ] {
            assert_eq!(home.owns(&r), home_owns, "home {r:?}");
        }
        assert!(b.owns(&KeyRange::prefix(b"jobs/")));
        assert!(b.owns(&range("jobs/a", "jobs/b")));
        assert!(b.owns(&KeyRange::single(b"queue/1".to_vec())));
        assert!(!b.owns(&range("jobs/a", "k")));
        assert!(!b.owns(&KeyRange::single(b"config".to_vec())));
        assert!(!b.owns(&KeyRange::prefix(b"")));
        assert!(
            b.owns(&KeyRange::prefix(b"\0latchkey/audit/")),
            "own records"
        );
        let e = b
            .check_read(&KeyRange::single(b"config".to_vec()))
            .unwrap_err();
        assert_eq!(e.code, ErrorCode::WrongCell);
        assert!(e.message.contains("version 3"), "{}", e.message);
        assert!(!Ownership::nothing().owns(&KeyRange::single(b"a".to_vec())));
        let fenced = d.ownership_of("b").with_leaving(vec![b"jobs/".to_vec()]);
        let job = KeyRange::single(b"jobs/1".to_vec());
        assert!(fenced.check_read(&job).is_ok(), "a leaving prefix is read");
        assert_eq!(
            fenced.check_write(&job).unwrap_err().code,
            ErrorCode::WrongCell
        );
        assert!(fenced
            .check_write(&KeyRange::single(b"queue/1".to_vec()))
            .is_ok());
        assert!(fenced
            .check_write(&KeyRange::prefix(b"\0latchkey/audit/"))
            .is_ok());
        let round = Ownership::decode(&fenced.encode()).unwrap();
        assert_eq!(round, fenced);
        let moved = d.clone().with_floor(b"jobs/", "b", 500);
        assert_eq!(
            moved.ownership_of("b").floor(&KeyRange::prefix(b"jobs/a")),
            500
        );
        assert_eq!(
            moved.ownership_of("b").floor(&KeyRange::prefix(b"queue/")),
            0
        );
        assert_eq!(
            moved.ownership_of(HOME).floor(&KeyRange::prefix(b"jobs/")),
            0
        );
        let again = moved.with_floor(b"jobs/", "b", 900);
        assert_eq!(
            again.floors.len(),
            1,
            "a later move of the prefix replaces it"
        );
    }

    #[test]
    fn changes_are_checked_and_each_is_a_new_version() {
        let d = two_cells();
        assert_eq!(
            d.with_assignment(b"jobs/", "b").unwrap(),
            None,
            "already so"
        );
        assert!(d.with_assignment(b"jobs/x/", "b").is_err(), "nested");
        assert!(d.with_assignment(b"job", HOME).is_err(), "nests over jobs/");
        assert!(d.with_assignment(b"x/", "c").is_err(), "unknown cell");
        assert!(d.with_assignment(b"", "b").is_err());
        assert!(d.with_assignment(b"\0latchkey/x", "b").is_err());
        assert!(
            d.with_assignment(b"\0", "b").is_err(),
            "over the reserved prefix"
        );
        let back = d.with_assignment(b"jobs/", HOME).unwrap().unwrap();
        assert_eq!(back.version, 4);
        assert_eq!(back.owner_of(b"jobs/1"), HOME);
        assert_eq!(d.with_cell("b", vec!["127.0.0.1:1".into()]).unwrap(), d);
        assert!(d.with_cell("b", vec!["127.0.0.1:2".into()]).is_err());
        assert!(d.with_cell(HOME, vec!["127.0.0.1:2".into()]).is_err());
        assert!(d.with_cell("B", vec!["127.0.0.1:2".into()]).is_err());
        assert!(d.with_cell("c", vec![]).is_err());
        let round = Directory::decode(&d.encode()).unwrap();
        assert_eq!(round, d);
    }
}
