//! What the loadtest's integration tests share: running the binary and
//! showing what it said.

use std::process::{Command, Output};

const LOADTEST: &str = env!("CARGO_BIN_EXE_latchkey-loadtest");

pub fn loadtest(args: &[&str]) -> Output {
    Command::new(LOADTEST)
        .args(args)
        .output()
        .expect("run latchkey-loadtest")
}

/// Its exit status and everything it printed, for an assertion message.
pub fn text(out: &Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A path as an argument.
pub fn arg(p: &std::path::Path) -> &str {
    p.to_str().expect("a UTF-8 path")
}

/// Whether `program --version` runs.
fn runs(program: &str) -> bool {
    Command::new(program)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Debian's chromium, installed here when it is missing (as root, from
/// the package registry); Err says why there is none.
pub fn chromium() -> Result<&'static str, String> {
    const CHROMIUM: &str = "chromium";
    if runs(CHROMIUM) {
        return Ok(CHROMIUM);
    }
    let install = Command::new("apt-get")
        .args(["install", "-y", "-qq", CHROMIUM])
        .env("DEBIAN_FRONTEND", "noninteractive")
        .output();
    match install {
        Ok(o) if o.status.success() && runs(CHROMIUM) => Ok(CHROMIUM),
        Ok(o) => Err(format!(
            "chromium cannot be installed: apt-get install chromium: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        )),
        Err(e) => Err(format!("chromium cannot be installed: apt-get: {e}")),
    }
}
