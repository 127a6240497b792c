//! The proxies' operators' API for the directory of cells
//! (`/v1/admin/directory`), as the load test and the safety suite use it:
//! one call, a move of a prefix, and the cell that owns a prefix.

use serde_json::{json, Value};
use std::time::Duration;

/// How long one call may take: past a move's own bound (120 s, then the
/// proxy undoes it) and its clean-up.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(150);

/// `method path` with `body` (JSON) on the proxy whose HTTP API is at
/// `http`: the answer's status and body (`Null` if it is not JSON).
pub async fn call(
    http: &str,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> Result<(u16, Value), String> {
    let client = reqwest::Client::builder()
        .timeout(CALL_TIMEOUT)
        .build()
        .map_err(|e| e.to_string())?;
    let what = format!("{method} {path}");
    let mut request = client.request(method, format!("{}{path}", crate::scenario::url(http)));
    if let Some(body) = body {
        request = request.json(&body);
    }
    let resp = request.send().await.map_err(|e| format!("{what}: {e}"))?;
    let status = resp.status().as_u16();
    Ok((status, resp.json().await.unwrap_or(Value::Null)))
}

/// Moves `prefix` to cell `to`: the write pause the proxy reported, or why
/// the move failed (the proxy undid it).
pub async fn move_prefix(http: &str, prefix: &str, to: &str) -> Result<Duration, String> {
    let body = json!({ "prefix": prefix, "cell": to });
    let (status, answer) = call(
        http,
        reqwest::Method::POST,
        "/v1/admin/directory/moves",
        Some(body),
    )
    .await?;
    match (status, answer["pause_ms"].as_u64()) {
        (200, Some(ms)) => Ok(Duration::from_millis(ms)),
        _ => Err(format!(
            "{status} {}",
            answer["message"].as_str().unwrap_or("?")
        )),
    }
}

/// The directory as the proxy reads it.
pub async fn directory(http: &str) -> Result<Value, String> {
    let (status, directory) = call(http, reqwest::Method::GET, "/v1/admin/directory", None).await?;
    if status != 200 {
        return Err(format!("reading the directory: {status} {directory}"));
    }
    Ok(directory)
}

/// The cell `directory` gives `prefix`: the longest assigned prefix it
/// starts with, else home.
pub fn owner_of(directory: &Value, prefix: &str) -> String {
    directory["prefixes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|a| a["prefix"].as_str().is_some_and(|p| prefix.starts_with(p)))
        .max_by_key(|a| a["prefix"].as_str().map_or(0, str::len))
        .and_then(|a| a["cell"].as_str())
        .unwrap_or("home")
        .to_string()
}
