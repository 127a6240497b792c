//! `latchkey-proxy directory ...`: the operators' command line for the
//! directory of cells (DESIGN section 9), a client of a running proxy's
//! `/v1/admin/directory` API. It shows the directory, adds a cell, assigns
//! an empty prefix and moves a prefix online, printing the proxy's answer
//! as JSON. With authentication on, it sends root's token (`--token` or
//! `LATCHKEY_TOKEN`).
//!
//! Exit status: 0 when the proxy did it; 1 when it refused or failed (its
//! error on stderr; nothing changed, or a failed move was undone); 2 when
//! the command line is wrong or no proxy answered.

use clap::{Parser, Subcommand};
use serde_json::{json, Value};
use std::ffi::OsString;
use std::process::ExitCode;
use std::time::Duration;

#[derive(Debug, Parser)]
#[command(
    name = "latchkey-proxy directory",
    about = "Show and change the directory of cells through a running proxy"
)]
struct DirectoryCli {
    /// The proxy's HTTP address.
    #[arg(
        long,
        global = true,
        default_value = "127.0.0.1:7700",
        env = "LATCHKEY_PROXY"
    )]
    proxy: String,
    /// A bearer token, with authentication on (root's: the directory is
    /// root's to change).
    #[arg(long, global = true, env = "LATCHKEY_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// How long to wait for the answer (a move takes up to 120 s before
    /// the proxy undoes it).
    #[arg(long, global = true, default_value = "150s", value_parser = humantime::parse_duration)]
    timeout: Duration,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// The directory: its version, its cells and which cell owns which
    /// prefix.
    Show,
    /// Adds a cell by its members' client addresses (it must answer, and
    /// not be in the directory already).
    AddCell {
        name: String,
        /// Its members' client addresses (space- or comma-separated).
        #[arg(required = true, value_delimiter = ',')]
        endpoints: Vec<String>,
    },
    /// Assigns a prefix that holds no keys to a cell ("home" gives it
    /// back).
    Assign { prefix: String, cell: String },
    /// Moves a prefix with its keys, sessions, locks and elections to a
    /// cell, online: writes under it pause for the switch only.
    Move { prefix: String, cell: String },
}

/// Runs the command line `args` (its first item is the command's name).
pub fn main(args: impl IntoIterator<Item = OsString>) -> ExitCode {
    let cli = match DirectoryCli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { 2 } else { 0 });
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("latchkey-proxy directory: {e}");
            return ExitCode::from(2);
        }
    };
    match runtime.block_on(run(&cli)) {
        Ok(answer) => {
            println!(
                "{}",
                serde_json::to_string_pretty(&answer).unwrap_or_default()
            );
            ExitCode::SUCCESS
        }
        Err((code, why)) => {
            eprintln!("latchkey-proxy directory: {why}");
            ExitCode::from(code)
        }
    }
}

/// The request the command makes: method, path and body.
fn request(command: &Command) -> (reqwest::Method, String, Option<Value>) {
    use reqwest::Method;
    match command {
        Command::Show => (Method::GET, "/v1/admin/directory".into(), None),
        Command::AddCell { name, endpoints } => (
            Method::PUT,
            format!("/v1/admin/directory/cells/{name}"),
            Some(json!({ "endpoints": endpoints })),
        ),
        Command::Assign { prefix, cell } => (
            Method::PUT,
            "/v1/admin/directory/prefixes".into(),
            Some(json!({ "prefix": prefix, "cell": cell })),
        ),
        Command::Move { prefix, cell } => (
            Method::POST,
            "/v1/admin/directory/moves".into(),
            Some(json!({ "prefix": prefix, "cell": cell })),
        ),
    }
}

async fn run(cli: &DirectoryCli) -> Result<Value, (u8, String)> {
    let (method, path, body) = request(&cli.command);
    let base = if cli.proxy.contains("://") {
        cli.proxy.trim_end_matches('/').to_string()
    } else {
        format!("http://{}", cli.proxy)
    };
    let client = reqwest::Client::builder()
        .timeout(cli.timeout)
        .connect_timeout(Duration::from_secs(5))
        .build()
        .map_err(|e| (2, e.to_string()))?;
    let mut req = client.request(method, format!("{base}{path}"));
    if let Some(token) = &cli.token {
        req = req.bearer_auth(token);
    }
    if let Some(body) = body {
        req = req.json(&body);
    }
    let resp = req
        .send()
        .await
        .map_err(|e| (2, format!("no answer from the proxy at {base}: {e}")))?;
    let status = resp.status();
    let answer: Value = resp.json().await.unwrap_or(Value::Null);
    if status.is_success() {
        return Ok(answer);
    }
    Err((
        1,
        format!(
            "{} {}: {}",
            status.as_u16(),
            answer["code"].as_str().unwrap_or("error"),
            answer["message"].as_str().unwrap_or("(no message)")
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(args: &[&str]) -> DirectoryCli {
        DirectoryCli::try_parse_from(std::iter::once("directory").chain(args.iter().copied()))
            .expect("parses")
    }

    #[test]
    fn each_command_is_its_request_of_the_directory_api() {
        let (method, path, body) = request(&parsed(&["show"]).command);
        assert_eq!(
            (method.as_str(), path.as_str(), body),
            ("GET", "/v1/admin/directory", None)
        );
        let (method, path, body) = request(
            &parsed(&[
                "add-cell",
                "b",
                "10.0.0.1:7801,10.0.0.2:7801",
                "10.0.0.3:7801",
            ])
            .command,
        );
        assert_eq!(
            (method.as_str(), path.as_str()),
            ("PUT", "/v1/admin/directory/cells/b")
        );
        assert_eq!(
            body,
            Some(json!({"endpoints": ["10.0.0.1:7801", "10.0.0.2:7801", "10.0.0.3:7801"]}))
        );
        let (method, path, body) = request(&parsed(&["move", "jobs/", "b"]).command);
        assert_eq!(
            (method.as_str(), path.as_str()),
            ("POST", "/v1/admin/directory/moves")
        );
        assert_eq!(body, Some(json!({"prefix": "jobs/", "cell": "b"})));
        let (method, _, body) = request(&parsed(&["assign", "jobs/", "home"]).command);
        assert_eq!(method.as_str(), "PUT");
        assert_eq!(body, Some(json!({"prefix": "jobs/", "cell": "home"})));
    }

    #[test]
    fn a_command_without_what_it_needs_is_refused() {
        let go = |args: &[&str]| {
            DirectoryCli::try_parse_from(std::iter::once("directory").chain(args.iter().copied()))
                .is_err()
        };
        assert!(go(&["add-cell", "b"]), "no endpoints");
        assert!(go(&["move", "jobs/"]), "no cell");
        assert!(go(&["rename"]), "no such command");
        assert!(go(&["show", "--timeout", "soon"]), "not a duration");
    }
}
