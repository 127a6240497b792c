//! `latchkey-loadtest cluster up | down`, as an operator runs it: a cell and
//! proxies that outlive the command and serve at once, an etcd cluster
//! beside it, and `down` leaving no process and no data behind.

use crate::common::{arg, loadtest, text};
use latchkey_testkit::{http_get, http_request};
use std::path::Path;
use std::process::Output;

/// The JSON line `up` ends with.
fn summary(out: &Output) -> serde_json::Value {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().last().unwrap_or_default();
    serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {}", text(out)))
}

fn strings(v: &serde_json::Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// The pids the state file records.
fn pids(state: &Path) -> Vec<u32> {
    let text = std::fs::read_to_string(state).expect("state file");
    let v: serde_json::Value = serde_json::from_str(&text).expect("state json");
    v["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .map(|p| p["pid"].as_u64().expect("pid") as u32)
        .collect()
}

/// Whether `pid` runs (a zombie does not).
fn runs(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, r)| !r.trim_start().starts_with('Z'))
        })
        .unwrap_or(false)
}

/// `down` stops every recorded process and removes the data and the state
/// file; a second `down` says no cluster is up.
fn down_leaves_nothing(state: &Path, dir: &Path) {
    let pids = pids(state);
    let down = loadtest(&["cluster", "down", "--state", arg(state)]);
    assert!(down.status.success(), "{}", text(&down));
    for pid in pids {
        assert!(!runs(pid), "pid {pid} still runs after down");
    }
    assert!(!dir.exists(), "{} is still there", dir.display());
    assert!(!state.exists(), "the state file is still there");
    let again = loadtest(&["cluster", "down", "--state", arg(state)]);
    assert_eq!(again.status.code(), Some(1), "{}", text(&again));
    assert!(
        String::from_utf8_lossy(&again.stderr).contains("no cluster is up"),
        "{}",
        text(&again)
    );
}

/// `cluster up` of three-member cells and two proxies, with `extra`
/// flags, in a temporary directory: it, the state file and the summary.
fn up(extra: &[&str]) -> (tempfile::TempDir, std::path::PathBuf, serde_json::Value) {
    let tmp = tempfile::tempdir().expect("temp dir");
    let state = tmp.path().join("cluster.json");
    let mut args = vec!["cluster", "up", "--cells", "3", "--proxies", "2"];
    args.extend(extra);
    args.extend(["--state", arg(&state)]);
    let up = loadtest(&args);
    assert!(up.status.success(), "{}", text(&up));
    let s = summary(&up);
    (tmp, state, s)
}

#[tokio::test]
async fn a_cell_behind_two_proxies_serves_until_down_leaves_nothing() {
    let (_tmp, state, s) = up(&[]);
    let state_arg = arg(&state);
    let (cells, http) = (strings(&s["cells"]), strings(&s["http"]));
    assert_eq!(
        (cells.len(), http.len(), strings(&s["grpc"]).len()),
        (3, 2, 2)
    );
    let dir = Path::new(s["dir"].as_str().expect("dir")).to_path_buf();

    // The command has returned; what it started serves: a write through
    // one proxy is read through the other and on a member.
    let put = http_request(&http[0], "PUT", "/v1/kv/loadtest-cluster", "up").await;
    assert!(
        put.as_deref()
            .is_some_and(|r| r.starts_with("HTTP/1.1 200")),
        "{put:?}"
    );
    let got = http_get(&http[1], "/v1/kv/loadtest-cluster").await;
    assert!(
        got.as_deref()
            .is_some_and(|r| r.contains(r#""value":"up""#)),
        "{got:?}"
    );
    let mut member = etcd_client::Client::connect([cells[2].as_str()], None)
        .await
        .expect("connect to a member");
    let kv = member.get("loadtest-cluster", None).await.expect("get");
    assert_eq!(kv.kvs().first().map(|kv| kv.value()), Some(&b"up"[..]));

    // A second `up` on the same state is refused while the first runs.
    let twice = loadtest(&["cluster", "up", "--state", state_arg]);
    assert_eq!(twice.status.code(), Some(1), "{}", text(&twice));
    assert!(
        String::from_utf8_lossy(&twice.stderr).contains("a cluster is up"),
        "{}",
        text(&twice)
    );

    down_leaves_nothing(&state, &dir);
}

#[tokio::test]
async fn an_etcd_cluster_comes_up_beside_for_comparison() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let state = tmp.path().join("etcd.json");
    let up = loadtest(&[
        "cluster",
        "up",
        "--etcd",
        "--etcd-bin",
        "/usr/bin/etcd",
        "--proxies",
        "1",
        "--state",
        arg(&state),
    ]);
    assert!(up.status.success(), "{}", text(&up));
    let s = summary(&up);
    let cells = strings(&s["cells"]);
    assert_eq!(cells.len(), 3);
    assert!(strings(&s["http"]).is_empty());
    // etcd's own grpc-proxy, for `compare` through proxies on both sides.
    let proxies = strings(&s["grpc"]);
    assert_eq!(proxies.len(), 1, "{s}");
    let mut through = etcd_client::Client::connect(&proxies, None)
        .await
        .expect("connect to etcd's grpc-proxy");
    through
        .put("loadtest-cluster", "etcd", None)
        .await
        .expect("put through the grpc-proxy");
    let mut c = etcd_client::Client::connect(&cells, None)
        .await
        .expect("connect to etcd");
    let got = c.get("loadtest-cluster", None).await.expect("get");
    assert_eq!(got.kvs()[0].value_str().ok(), Some("etcd"));
    let status = c.status().await.expect("status");
    assert!(status.version().starts_with("3."), "{}", status.version());
    let dir = Path::new(s["dir"].as_str().expect("dir")).to_path_buf();
    down_leaves_nothing(&state, &dir);
}

#[test]
fn bad_flags_get_a_clear_error_and_start_nothing() {
    for (args, expect) in [
        (
            &["cluster", "up", "--cells", "4"][..],
            "1, 3, 5 or 7 voters",
        ),
        (&["cluster", "up", "--proxies", "17"][..], "--proxies"),
        (&["cluster", "sideways"][..], "unrecognized subcommand"),
    ] {
        let out = loadtest(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", text(&out));
        assert!(
            String::from_utf8_lossy(&out.stderr).contains(expect),
            "{args:?}: {}",
            text(&out)
        );
    }
}

#[tokio::test]
async fn two_cells_come_up_and_a_prefix_moves_between_them_under_load() {
    // Issue 33: `cluster up --cell-groups 2` starts two cells behind the
    // proxies and names the second in the directory; the `move` scenario
    // moves a prefix there and back while writers, sessions and lock
    // contenders work under it.
    let (_tmp, state, s) = up(&["--cell-groups", "2"]);
    let state_arg = arg(&state);
    let dir = Path::new(s["dir"].as_str().expect("dir")).to_path_buf();
    let http = strings(&s["http"]);
    let directory = http_get(&http[1], "/v1/admin/directory").await;
    assert!(
        directory
            .as_deref()
            .is_some_and(|d| d.contains(r#""name":"cell2""#)),
        "{directory:?}"
    );

    let moved = loadtest(&[
        "move",
        "--state",
        state_arg,
        "--duration",
        "12s",
        "--moves",
        "2",
        "--writers",
        "4",
        "--sessions",
        "8",
        "--contenders",
        "2",
    ]);
    let stdout = String::from_utf8_lossy(&moved.stdout);
    let result: serde_json::Value = stdout
        .lines()
        .find(|l| l.starts_with('{'))
        .and_then(|l| serde_json::from_str(l).ok())
        .unwrap_or_else(|| panic!("no result line: {}", text(&moved)));
    assert!(moved.status.success(), "{}", text(&moved));
    assert_eq!(result["moves"], 2, "both moves went through: {result}");
    for counter in ["lost_writes", "sessions_expired", "lock_violations"] {
        assert_eq!(result[counter], 0, "{counter}: {result}");
    }
    assert!(
        result["move_pause_max_ms"]
            .as_f64()
            .is_some_and(|p| p > 0.0),
        "each move reported its pause: {result}"
    );
    for (what, least) in [("lock_grants", 1), ("keep_alives", 1), ("writers", 4)] {
        assert!(
            result[what].as_u64().is_some_and(|n| n >= least),
            "{what}: {result}"
        );
    }

    down_leaves_nothing(&state, &dir);
}
