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

#[cfg(test)]
mod tests {
    use super::metric_value;

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
}
