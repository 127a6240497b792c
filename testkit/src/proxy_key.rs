//! [`key_file`]: the proxies' key file every member and every proxy a test
//! binary starts is given (`--proxy-key-file`), so that proxies write
//! latchkey's records while authentication is off and clients, which do
//! not hold the key, cannot.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// One file per test process, made at first use and kept until it exits.
pub fn key_file() -> &'static Path {
    static FILE: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
    let (_, path) = FILE.get_or_init(|| {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("proxy.key");
        latchkey_shared::auth::proxy_key::create_or_read(&path).expect("a proxy key file");
        (dir, path)
    });
    path
}

/// `--proxy-key-file <key_file()>`, unless `args` give one already.
pub fn flag_unless_given<'a>(args: impl IntoIterator<Item = &'a str>) -> Vec<String> {
    if args.into_iter().any(|a| a == "--proxy-key-file") {
        return Vec::new();
    }
    vec![
        "--proxy-key-file".to_string(),
        key_file()
            .to_str()
            .expect("a UTF-8 temporary path")
            .to_string(),
    ]
}
