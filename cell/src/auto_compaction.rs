//! Automatic compaction by retention, like etcd's `--auto-compaction-mode`
//! and `--auto-compaction-retention`: the leader proposes a `Compact` that
//! keeps the last N revisions, or the revisions of the last duration.

use crate::node::CellNode;
use crate::state_machine::command::Request;
use anyhow::{bail, Context};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// How much history automatic compaction keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retention {
    Off,
    Revisions(i64),
    Period(Duration),
}

/// How often revision mode looks at the revision (etcd: 5 minutes).
const REVISION_CHECK: Duration = Duration::from_secs(5);

fn parse_duration(s: &str) -> anyhow::Result<Duration> {
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    let n: f64 = number
        .parse()
        .with_context(|| format!("'{s}' is not a duration such as 30m, 1h or 90s"))?;
    let secs = match unit {
        // A bare number is hours, as in etcd.
        "" | "h" => n * 3600.0,
        "m" => n * 60.0,
        "s" => n,
        "ms" => n / 1000.0,
        _ => bail!("'{s}': unknown unit '{unit}' (use ms, s, m or h)"),
    };
    if !secs.is_finite() || secs < 0.0 {
        bail!("'{s}' is not a valid duration");
    }
    Ok(Duration::from_secs_f64(secs))
}

/// Reads `--auto-compaction-mode` and `--auto-compaction-retention`.
pub fn parse_retention(mode: &str, retention: &str) -> anyhow::Result<Retention> {
    let retention = retention.trim();
    match mode {
        "revision" => {
            let n: i64 = retention.parse().with_context(|| {
                format!("--auto-compaction-retention '{retention}' is not a number of revisions")
            })?;
            match n {
                0 => Ok(Retention::Off),
                n if n > 0 => Ok(Retention::Revisions(n)),
                _ => bail!("--auto-compaction-retention must not be negative"),
            }
        }
        "periodic" => match parse_duration(retention)? {
            d if d.is_zero() => Ok(Retention::Off),
            d if d < Duration::from_secs(1) => {
                bail!("--auto-compaction-retention '{retention}' is under one second")
            }
            d => Ok(Retention::Period(d)),
        },
        other => bail!("--auto-compaction-mode '{other}' is neither 'periodic' nor 'revision'"),
    }
}

/// The leader's compaction loop; idle on followers. Runs for the node's life.
pub async fn run(node: Arc<CellNode>, retention: Retention) {
    let check = match retention {
        Retention::Off => return,
        Retention::Revisions(_) => REVISION_CHECK,
        // Sample the revision ten times per retention period.
        Retention::Period(d) => (d / 10).max(Duration::from_secs(1)),
    };
    // (when, revision) samples, oldest first, for periodic mode.
    let mut samples: VecDeque<(Instant, i64)> = VecDeque::new();
    loop {
        tokio::time::sleep(check).await;
        let (revision, compacted) = node
            .state
            .read(|s| (s.keys.revision(), s.keys.compact_revision()));
        let now = Instant::now();
        let target = match retention {
            Retention::Off => return,
            Retention::Revisions(n) => revision - n,
            Retention::Period(d) => {
                samples.push_back((now, revision));
                // The newest sample at least `d` old is the compaction point.
                let mut target = 0;
                while let Some(&(at, rev)) = samples.front() {
                    if now.duration_since(at) < d {
                        break;
                    }
                    target = rev;
                    samples.pop_front();
                }
                target
            }
        };
        if target <= compacted || !node.is_leader() {
            continue;
        }
        match node.write(Request::Compact { revision: target }).await {
            Ok(resp) => match resp.result {
                Ok(_) => tracing::info!(revision = target, "auto-compaction"),
                Err(e) => tracing::debug!(error = %e, "auto-compaction skipped"),
            },
            Err(e) => tracing::warn!(error = %e, "auto-compaction failed; will retry"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retention_reads_like_etcd_and_rejects_nonsense() {
        assert_eq!(parse_retention("periodic", "0").ok(), Some(Retention::Off));
        assert_eq!(
            parse_retention("periodic", "1").ok(),
            Some(Retention::Period(Duration::from_secs(3600)))
        );
        assert_eq!(
            parse_retention("periodic", "30m").ok(),
            Some(Retention::Period(Duration::from_secs(1800)))
        );
        assert_eq!(
            parse_retention("revision", "1000").ok(),
            Some(Retention::Revisions(1000))
        );
        assert!(parse_retention("revision", "1h").is_err());
        assert!(parse_retention("revision", "-5").is_err());
        assert!(parse_retention("periodic", "5 parsecs").is_err());
        assert!(parse_retention("periodic", "10ms").is_err());
        assert!(parse_retention("hourly", "1").is_err());
    }
}
