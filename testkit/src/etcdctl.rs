//! etcd's own command-line client (API v3) against a cell.
//!
//! Output formats worth knowing when parsing: etcdctl prints member ids
//! with `%16x` in `member add/promote/remove` (space-padded: an id below
//! 2^60 starts with spaces) but with `%x` in `member list` and `endpoint
//! status`, and lease ids with `%016x` (zero-padded).

use std::process::Stdio;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};
use tokio::time::{timeout, Duration};

/// How long one etcdctl run may take. Its own `--command-timeout` is 10 s;
/// this also covers starting the process on a loaded machine.
const RUN_WITHIN: Duration = Duration::from_secs(30);

/// How long [`EtcdctlProcess::lines`] waits for each line.
const LINE_WITHIN: Duration = Duration::from_secs(15);

/// etcdctl with its endpoints; `--command-timeout` only for one-shot
/// commands (a watch, lock or election runs as long as the test wants).
fn command(endpoints: &str, one_shot: bool, args: &[&str]) -> Command {
    let mut cmd = Command::new("etcdctl");
    cmd.env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={endpoints}"));
    if one_shot {
        cmd.arg("--command-timeout=10s");
    }
    cmd.args(args).kill_on_drop(true);
    cmd
}

/// Runs etcdctl against `endpoints` (comma-separated `host:port`), with
/// `stdin` as its input if given: stdout on success, or `Err` with stderr
/// and stdout on failure. Panics only if etcdctl cannot run at all.
pub async fn try_etcdctl(
    endpoints: &str,
    args: &[&str],
    stdin: Option<&str>,
) -> Result<String, String> {
    let mut child = command(endpoints, true, args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("etcdctl is installed (scripts/install-deps.sh installs etcd-client)");
    let mut input = child.stdin.take().expect("etcdctl's stdin");
    if let Some(text) = stdin {
        input
            .write_all(text.as_bytes())
            .await
            .expect("write etcdctl's stdin");
    }
    drop(input);
    let out = timeout(RUN_WITHIN, child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("etcdctl {args:?} still running after {RUN_WITHIN:?}"))
        .expect("etcdctl ran");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if out.status.success() {
        Ok(stdout)
    } else {
        let stderr = String::from_utf8_lossy(&out.stderr);
        Err(format!("etcdctl {args:?} failed: {stderr}{stdout}"))
    }
}

/// Like [`try_etcdctl`], for a command that must succeed: its stdout.
pub async fn etcdctl(endpoints: &str, args: &[&str], stdin: Option<&str>) -> String {
    try_etcdctl(endpoints, args, stdin)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

/// The member id of etcdctl's `member add|promote|remove` answer, whose
/// first line is `Member %16x <verb> ... cluster %16x`: hex, padded with
/// spaces to 16 characters (so an id below 2^60 starts with spaces).
pub fn member_id_in(output: &str) -> u64 {
    let printed = output
        .lines()
        .next()
        .and_then(|l| l.strip_prefix("Member "))
        .and_then(|l| l.get(..16))
        .unwrap_or_else(|| panic!("not a member answer: {output:?}"));
    u64::from_str_radix(printed.trim_start(), 16)
        .unwrap_or_else(|e| panic!("member id {printed:?} in {output:?}: {e}"))
}

/// A long-running etcdctl (watch, lock, elect) whose output is read line
/// by line; killed when dropped.
pub struct EtcdctlProcess {
    child: Child,
    lines: Lines<BufReader<ChildStdout>>,
}

impl EtcdctlProcess {
    pub fn start(endpoints: &str, args: &[&str]) -> EtcdctlProcess {
        let mut child = command(endpoints, false, args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("etcdctl runs");
        let stdout = child.stdout.take().expect("etcdctl's stdout");
        EtcdctlProcess {
            child,
            lines: BufReader::new(stdout).lines(),
        }
    }

    /// The next `n` lines, each within 15 s.
    pub async fn lines(&mut self, n: usize) -> Vec<String> {
        let mut out = Vec::new();
        while out.len() < n {
            let line = timeout(LINE_WITHIN, self.lines.next_line())
                .await
                .unwrap_or_else(|_| panic!("no output within {LINE_WITHIN:?}; so far {out:?}"))
                .expect("read etcdctl output")
                .unwrap_or_else(|| panic!("etcdctl ended; so far {out:?}"));
            out.push(line);
        }
        out
    }

    /// Whether no line (and no end of output) arrives within `wait`.
    pub async fn quiet_for(&mut self, wait: Duration) -> bool {
        timeout(wait, self.lines.next_line()).await.is_err()
    }

    /// Ctrl-C: etcdctl releases its lock or leadership and exits.
    pub fn interrupt(&self) {
        if let Some(pid) = self.child.id() {
            let _ = std::process::Command::new("kill")
                .args(["-INT", &pid.to_string()])
                .status();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::member_id_in;

    #[test]
    fn member_ids_are_read_with_or_without_padding() {
        let full = "Member d3a1c0ffee15900d added to cluster 8e9e05c52164694d\n\nETCD_NAME=\"x\"\n";
        assert_eq!(member_id_in(full), 0xd3a1_c0ff_ee15_900d);
        // Below 2^60: `%16x` pads with spaces (the flaky "InvalidDigit").
        let padded = format!(
            "Member {:16x} promoted in cluster {:16x}\n",
            0x2a_u64, 7_u64
        );
        assert!(padded.starts_with("Member               2a promoted"));
        assert_eq!(member_id_in(&padded), 0x2a);
    }
}
