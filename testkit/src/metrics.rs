//! A member's metrics address: `/metrics` in Prometheus text, `/healthz`.

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::{timeout, Duration};

/// A minimal HTTP/1.1 GET on loopback: the whole response (status line,
/// headers and body), or `None` if the member did not answer in time.
pub async fn http_get(addr: &str, path: &str) -> Option<String> {
    http_request(addr, "GET", path, "").await
}

/// A minimal HTTP/1.1 request on loopback with a text body: the whole
/// response, or `None` if nothing answered in time.
pub async fn http_request(addr: &str, method: &str, path: &str, body: &str) -> Option<String> {
    let mut s = timeout(Duration::from_secs(2), tokio::net::TcpStream::connect(addr))
        .await
        .ok()?
        .ok()?;
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.ok()?;
    let mut buf = Vec::new();
    timeout(Duration::from_secs(5), s.read_to_end(&mut buf))
        .await
        .ok()?
        .ok()?;
    Some(String::from_utf8_lossy(&buf).into_owned())
}

/// The value of the series `series` in Prometheus text: a bare metric name
/// (`latchkey_keys`) or a name with its labels exactly as exported
/// (`latchkey_watch_commit_to_send_seconds_bucket{le="+Inf"}`). `None` if
/// it is absent (a counter appears once it was first incremented).
pub fn metric_value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
}

/// The metric families in Prometheus text `text` that are latchkey's
/// (`latchkey_...`) and have a `# TYPE` line but no `# HELP` line: metrics
/// recorded without a description in their crate's catalog.
pub fn undescribed(text: &str) -> Vec<String> {
    let family = |line: &str, prefix: &str| -> Option<String> {
        let name = line.strip_prefix(prefix)?.split_whitespace().next()?;
        name.starts_with("latchkey_").then(|| name.to_string())
    };
    let described: std::collections::BTreeSet<String> =
        text.lines().filter_map(|l| family(l, "# HELP ")).collect();
    let mut missing: Vec<String> = text
        .lines()
        .filter_map(|l| family(l, "# TYPE "))
        .filter(|name| !described.contains(name))
        .collect();
    missing.sort();
    missing.dedup();
    missing
}

#[cfg(test)]
mod tests {
    use super::{metric_value, undescribed};

    const TEXT: &str = "# TYPE latchkey_keys gauge\n\
        latchkey_keys 12\n\
        latchkey_keys_total 99\n\
        latchkey_watch_commit_to_send_seconds_bucket{le=\"0.5\"} 3\n\
        latchkey_watch_commit_to_send_seconds_bucket{le=\"+Inf\"} 4\n\
        latchkey_leader_changes_total 1 1700000000000\n";

    #[test]
    fn a_series_is_matched_by_its_whole_name() {
        assert_eq!(metric_value(TEXT, "latchkey_keys"), Some(12.0));
        assert_eq!(metric_value(TEXT, "latchkey_keys_total"), Some(99.0));
        assert_eq!(metric_value(TEXT, "latchkey_key"), None);
        assert_eq!(metric_value(TEXT, "latchkey_leases"), None);
    }

    #[test]
    fn labels_and_timestamps() {
        assert_eq!(
            metric_value(
                TEXT,
                "latchkey_watch_commit_to_send_seconds_bucket{le=\"+Inf\"}"
            ),
            Some(4.0)
        );
        assert_eq!(
            metric_value(TEXT, "latchkey_leader_changes_total"),
            Some(1.0)
        );
    }

    #[test]
    fn a_described_family_is_not_undescribed() {
        let text = "# HELP latchkey_keys Live keys.\n\
            # TYPE latchkey_keys gauge\n\
            latchkey_keys 12\n";
        assert!(undescribed(text).is_empty(), "{:?}", undescribed(text));
    }

    #[test]
    fn a_family_with_a_type_and_no_help_is_undescribed() {
        let text = "# HELP latchkey_keys Live keys.\n\
            # TYPE latchkey_keys gauge\n\
            latchkey_keys 12\n\n\
            # TYPE latchkey_watch_commit_to_send_seconds histogram\n\
            latchkey_watch_commit_to_send_seconds_bucket{le=\"+Inf\"} 4\n\
            latchkey_watch_commit_to_send_seconds_count 4\n";
        assert_eq!(
            undescribed(text),
            vec!["latchkey_watch_commit_to_send_seconds".to_string()]
        );
        // A HELP line for another family, or one whose name only starts
        // like it, does not describe it.
        let text = "# HELP latchkey_key Something else.\n\
            # TYPE latchkey_keys gauge\n\
            latchkey_keys 12\n";
        assert_eq!(undescribed(text), vec!["latchkey_keys".to_string()]);
    }

    #[test]
    fn families_that_are_not_latchkeys_are_ignored() {
        let text = "# TYPE process_cpu_seconds_total counter\n\
            process_cpu_seconds_total 3\n";
        assert!(undescribed(text).is_empty(), "{:?}", undescribed(text));
    }
}
