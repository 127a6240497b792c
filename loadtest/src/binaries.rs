//! The latchkey binaries a command starts, and the extra arguments they
//! get: one set of flags for `chaos` and `cluster up`.

use std::path::PathBuf;

#[derive(clap::Args, Debug, Clone)]
pub struct Binaries {
    /// The `latchkey-cell` binary (default: next to this one).
    #[arg(long)]
    pub cell_bin: Option<PathBuf>,
    /// The `latchkey-proxy` binary (default: next to this one).
    #[arg(long)]
    pub proxy_bin: Option<PathBuf>,
    /// An extra argument for every member, e.g. one of a debug build's
    /// `--unsafe-*` flags (repeatable).
    #[arg(long, allow_hyphen_values = true)]
    pub cell_arg: Vec<String>,
    /// An extra argument for every proxy (repeatable).
    #[arg(long, allow_hyphen_values = true)]
    pub proxy_arg: Vec<String>,
}

impl Binaries {
    /// The cell binary, which must exist.
    pub fn cell(&self) -> Result<PathBuf, String> {
        existing(&self.cell_bin, "latchkey-cell", "--cell-bin")
    }

    /// The proxy binary, which must exist.
    pub fn proxy(&self) -> Result<PathBuf, String> {
        existing(&self.proxy_bin, "latchkey-proxy", "--proxy-bin")
    }
}

fn existing(given: &Option<PathBuf>, name: &str, flag: &str) -> Result<PathBuf, String> {
    let bin = given.clone().unwrap_or_else(|| beside_this_binary(name));
    if bin.exists() {
        Ok(bin)
    } else {
        Err(format!(
            "{} does not exist (build it, or name it with {flag})",
            bin.display()
        ))
    }
}

/// `name` in the directory of this binary (where cargo puts the cell and
/// proxy binaries too), or `name` alone when that cannot be known.
fn beside_this_binary(name: &str) -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|d| d.join(name)))
        .unwrap_or_else(|| PathBuf::from(name))
}
