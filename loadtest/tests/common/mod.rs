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
