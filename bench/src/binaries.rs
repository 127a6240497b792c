//! The server binaries a benchmark starts: named by flag, or found next to
//! the benchmark's own binary (where `cargo build --release` puts them).

use std::path::PathBuf;

/// `given`, or the binary `name` beside this one; an error says how to get
/// it if it is not a file.
pub fn binary(given: Option<PathBuf>, name: &str, flag: &str) -> anyhow::Result<PathBuf> {
    let bin = match given {
        Some(bin) => bin,
        None => std::env::current_exe()?.with_file_name(name),
    };
    anyhow::ensure!(
        bin.is_file(),
        "no {} (build it, or name it with {flag})",
        bin.display()
    );
    Ok(bin)
}
