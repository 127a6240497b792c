//! The proxies' key: how a cell knows, while authentication is off, that a
//! write under `\0latchkey/` comes from a proxy writing its own records
//! (lock delays, audit, idempotency) and not from a client forging them.
//!
//! Operators give every cell member and every proxy the same file
//! (`--proxy-key-file`). A proxy presents its first line in the
//! [`PROXY_KEY_METADATA`] of the calls it makes as itself, never of the
//! calls it makes for a client. A member admits any line of its file, so
//! a key is rotated by adding the new line to the members, then moving
//! the proxies to it, then removing the old line. Without the file a
//! member admits no one: latchkey's records cannot be written through its
//! client port until authentication is on (then only a holder of the role
//! `latchkey-proxy` writes them, with or without the key).
//!
//! The key travels like a password: in the clear without TLS.

use sha2::{Digest, Sha256};
use std::path::Path;

/// The gRPC metadata a proxy's own calls carry the key in.
pub const PROXY_KEY_METADATA: &str = "latchkey-proxy-key";

/// Shortest key a file may hold: 128 bits as hex.
pub const MIN_KEY_CHARS: usize = 32;
const MAX_KEY_CHARS: usize = 512;

/// What is wrong with a key file, naming it.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct KeyFileError(String);

type Result<T> = std::result::Result<T, KeyFileError>;

macro_rules! refuse {
    ($($arg:tt)*) => { return Err(KeyFileError(format!($($arg)*))) };
}

/// The keys a member admits, kept as their SHA-256 digests.
#[derive(Clone, Default)]
pub struct ProxyKeys(Vec<[u8; 32]>);

impl std::fmt::Debug for ProxyKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ProxyKeys({} keys)", self.0.len())
    }
}

impl ProxyKeys {
    /// Every key line of the file at `path` (blank lines and lines
    /// starting with `#` skipped); at least one.
    pub fn load(path: &Path) -> Result<ProxyKeys> {
        let text = read(path)?;
        let keys = key_lines(&text)
            .map(|line| validate(line, path).map(digest))
            .collect::<Result<Vec<_>>>()?;
        if keys.is_empty() {
            refuse!("{} holds no key", path.display());
        }
        Ok(ProxyKeys(keys))
    }

    /// Whether `presented` is one of the keys (each compared in constant
    /// time, after hashing).
    pub fn admits(&self, presented: Option<&str>) -> bool {
        let Some(presented) = presented else {
            return false;
        };
        let d = digest(presented.trim());
        self.0
            .iter()
            .fold(false, |found, k| found | same_digest(k, &d))
    }
}

/// The key a proxy presents: the first key line of the file at `path`.
pub fn read_own(path: &Path) -> Result<String> {
    let text = read(path)?;
    let line = key_lines(&text)
        .next()
        .ok_or_else(|| KeyFileError(format!("{} holds no key", path.display())))?;
    validate(line, path).map(str::to_string)
}

/// A new random key (256 bits, hex), from the same source as the token
/// keys.
pub fn generate() -> String {
    super::token::new_secret()
        .expect("the system's random source")
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The key in the file at `path`, written first with a new key (readable
/// by its owner only) when there is no such file: `--dev` and the test
/// harnesses, which start both the members and the proxies.
pub fn create_or_read(path: &Path) -> Result<String> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
    {
        Ok(mut file) => {
            let key = generate();
            file.write_all(format!("{key}\n").as_bytes())
                .and_then(|()| file.sync_all())
                .map_err(|e| KeyFileError(format!("write {}: {e}", path.display())))?;
            Ok(key)
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => read_own(path),
        Err(e) => refuse!("create {}: {e}", path.display()),
    }
}

fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path)
        .map_err(|e| KeyFileError(format!("proxy key file {}: {e}", path.display())))
}

fn key_lines(text: &str) -> impl Iterator<Item = &str> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
}

/// A key is visible ASCII (it travels as gRPC metadata) of 32-512 chars.
fn validate<'a>(line: &'a str, path: &Path) -> Result<&'a str> {
    if !line.bytes().all(|b| b.is_ascii_graphic()) {
        refuse!("{}: a key is visible ASCII without spaces", path.display());
    }
    if !(MIN_KEY_CHARS..=MAX_KEY_CHARS).contains(&line.len()) {
        refuse!(
            "{}: a key has {MIN_KEY_CHARS} to {MAX_KEY_CHARS} characters, this one {}",
            path.display(),
            line.len()
        )
    }
    Ok(line)
}

fn digest(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

fn same_digest(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_member_admits_every_line_of_its_file_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys");
        let (old, new) = (generate(), generate());
        std::fs::write(&path, format!("# rotating\n{old}\n\n{new}\n")).unwrap();
        let keys = ProxyKeys::load(&path).unwrap();
        assert!(keys.admits(Some(&old)));
        assert!(keys.admits(Some(&new)));
        assert!(!keys.admits(Some(&generate())));
        assert!(!keys.admits(Some("")));
        assert!(!keys.admits(None));
        assert!(!ProxyKeys::default().admits(Some(&old)));
        // A proxy presents the first.
        assert_eq!(read_own(&path).unwrap(), old);
    }

    #[test]
    fn short_spaced_or_missing_keys_are_refused_with_the_file_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys");
        for bad in [
            "short\n",
            "has a space in it and is long enough to pass\n",
            "# only\n",
        ] {
            std::fs::write(&path, bad).unwrap();
            let e = ProxyKeys::load(&path).expect_err(bad).to_string();
            assert!(e.contains("keys"), "{e}");
        }
        let e = read_own(&dir.path().join("absent")).expect_err("absent");
        assert!(e.to_string().contains("absent"), "{e}");
    }

    #[test]
    fn create_or_read_writes_once_for_its_owner_and_then_reads() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("proxy.key");
        let first = create_or_read(&path).unwrap();
        assert_eq!(first.len(), 64);
        assert_eq!(create_or_read(&path).unwrap(), first);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert!(ProxyKeys::load(&path).unwrap().admits(Some(&first)));
    }
}
