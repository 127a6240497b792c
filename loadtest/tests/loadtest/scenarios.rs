//! Every load scenario, small, against a real 3-member cell behind two
//! proxies started by `cluster up`: each ends with one JSON line that
//! holds its figures and its safety counters, all zero; and a bad flag or
//! a missing cluster is a clear error with a non-zero exit.

use crate::common::{arg, loadtest, text};
use serde_json::Value;
use std::path::{Path, PathBuf};

/// A cluster that `cluster down` removes however the test ends.
struct UpCluster {
    state: PathBuf,
    _dir: tempfile::TempDir,
}

impl UpCluster {
    /// `cluster up` with `flags` (a 3-member cell behind two proxies, or
    /// `--etcd`).
    fn start(flags: &[&str]) -> UpCluster {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let state = dir.path().join("cluster.json");
        let mut up_args = vec!["cluster", "up", "--state", arg(&state)];
        up_args.extend(flags);
        let up = loadtest(&up_args);
        assert!(up.status.success(), "{}", text(&up));
        UpCluster { state, _dir: dir }
    }

    fn state(&self) -> &str {
        arg(&self.state)
    }
}

impl Drop for UpCluster {
    fn drop(&mut self) {
        let down = loadtest(&["cluster", "down", "--state", self.state()]);
        if !down.status.success() {
            eprintln!("cluster down: {}", text(&down));
        }
    }
}

/// Runs one scenario, which must succeed, and returns its JSON line after
/// checking what every scenario's line holds.
fn scenario(cluster: &UpCluster, out: &Path, args: &[&str]) -> Value {
    scenario_on(cluster, "latchkey", out, args)
}

fn scenario_on(cluster: &UpCluster, target: &str, out: &Path, args: &[&str]) -> Value {
    let mut all: Vec<&str> = args.to_vec();
    all.extend(["--state", cluster.state(), "--out", arg(out)]);
    let run = loadtest(&all);
    assert!(run.status.success(), "{}", text(&run));
    let stdout = String::from_utf8_lossy(&run.stdout);
    let line = stdout.lines().next().unwrap_or_default();
    let v: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {}", text(&run)));
    assert_eq!(v["scenario"], args[0], "{v}");
    assert_eq!(v["target"], target, "{v}");
    let counters = v["safety_counters"].as_array().expect("safety_counters");
    assert!(!counters.is_empty(), "{v}");
    for name in counters {
        let name = name.as_str().expect("a counter's name");
        assert_eq!(v[name], 0, "{name} in {v}");
    }
    // The table follows the line, and names the safety counters.
    for name in counters {
        let shown = name.as_str().unwrap_or_default().replace('_', " ");
        assert!(
            stdout.contains(&shown),
            "{shown} not in the table:\n{stdout}"
        );
    }
    v
}

fn number(v: &Value, field: &str) -> f64 {
    v[field]
        .as_f64()
        .unwrap_or_else(|| panic!("{field} is not a number in {v}"))
}

#[test]
fn every_scenario_runs_small_against_a_real_cluster_and_reports_zero_violations() {
    let cluster = UpCluster::start(&["--cells", "3", "--proxies", "2"]);
    let results = tempfile::NamedTempFile::new().expect("a results file");
    let out = results.path();

    let kv = scenario(
        &cluster,
        out,
        &[
            "kv",
            "--duration",
            "3s",
            "--clients",
            "8",
            "--connections",
            "2",
            "--keys",
            "50",
        ],
    );
    assert!(number(&kv, "ops_per_s") > 0.0, "{kv}");
    assert!(
        number(&kv, "puts_per_s") > 0.0 && number(&kv, "gets_per_s") > 0.0,
        "{kv}"
    );
    assert_eq!(kv["errors"], 0, "{kv}");
    assert!(
        number(&kv, "latency_p99_ms") >= number(&kv, "latency_p50_ms"),
        "{kv}"
    );
    assert!(!kv["series"].as_array().expect("series").is_empty(), "{kv}");

    // Eight workers on two counters: races are lost and tried again, and
    // the counters hold exactly the acknowledged increments (lost and
    // phantom are checked with the other safety counters).
    let cas = scenario(
        &cluster,
        out,
        &[
            "cas",
            "--duration",
            "3s",
            "--clients",
            "8",
            "--connections",
            "2",
            "--counters",
            "2",
        ],
    );
    assert!(number(&cas, "increments_per_s") > 0.0, "{cas}");
    assert!(number(&cas, "lost_races") > 0.0, "{cas}");
    assert_eq!(cas["errors"], 0, "{cas}");

    let grants = scenario(
        &cluster,
        out,
        &[
            "lease-grants",
            "--duration",
            "2s",
            "--clients",
            "8",
            "--connections",
            "2",
        ],
    );
    assert!(number(&grants, "grants_per_s") > 0.0, "{grants}");
    assert_eq!(grants["errors"], 0, "{grants}");

    let sessions = scenario(
        &cluster,
        out,
        &[
            "sessions",
            "--sessions",
            "400",
            "--ttl",
            "3",
            "--duration",
            "5s",
            "--streams",
            "2",
            "--http-clients",
            "4",
        ],
    );
    assert_eq!(number(&sessions, "sessions"), 400.0, "{sessions}");
    assert!(number(&sessions, "keepalives_per_s") > 0.0, "{sessions}");
    assert_eq!(sessions["errors"], 0, "{sessions}");
    // Many sessions on two proxies: one refresh batch per tick from each,
    // not one per session (a little over 1 where a tick falls at an edge
    // of the measured interval).
    let per_tick = number(&sessions, "refresh_batches_per_tick_per_proxy");
    assert!((0.5..=1.2).contains(&per_tick), "{sessions}");

    let watch = scenario(
        &cluster,
        out,
        &[
            "watch-fanout",
            "--watchers",
            "1000",
            "--per-stream",
            "100",
            "--connections",
            "2",
            "--writes",
            "5",
            "--write-every",
            "100ms",
            "--drain",
            "10s",
        ],
    );
    assert_eq!(number(&watch, "events_expected"), 5000.0, "{watch}");
    assert_eq!(number(&watch, "events_received"), 5000.0, "{watch}");
    // A thousand clients, one upstream watch at the cell per proxy.
    assert_eq!(number(&watch, "cell_watchers_added"), 2.0, "{watch}");
    assert!(number(&watch, "delivery_p99_ms") > 0.0, "{watch}");

    let locks = scenario(
        &cluster,
        out,
        &[
            "locks",
            "--duration",
            "3s",
            "--contenders",
            "4",
            "--locks",
            "2",
        ],
    );
    assert!(number(&locks, "acquisitions") > 0.0, "{locks}");
    assert_eq!(locks["errors"], 0, "{locks}");

    let slow = scenario(
        &cluster,
        out,
        &["slow-watcher", "--duration", "2s", "--writers", "4"],
    );
    assert!(number(&slow, "writes_per_s_alone") > 0.0, "{slow}");
    assert!(
        number(&slow, "writes_per_s_with_stalled_watcher") > 0.0,
        "{slow}"
    );

    let expiry = scenario(
        &cluster,
        out,
        &[
            "mass-expiry",
            "--duration",
            "1s",
            "--leases",
            "200",
            "--ttl",
            "3",
            "--writers",
            "4",
        ],
    );
    assert_eq!(number(&expiry, "leases"), 200.0, "{expiry}");
    assert!(
        number(&expiry, "write_around_expiry_p99_ms") > 0.0,
        "{expiry}"
    );

    // Last: it kills the leader (and starts it again).
    let failover = scenario(
        &cluster,
        out,
        &[
            "failover",
            "--sessions",
            "200",
            "--ttl",
            "3",
            "--writers",
            "4",
            "--kill-after",
            "1s",
            "--pause-after",
            "1s",
            "--pause-for",
            "2s",
            "--tail",
            "1s",
        ],
    );
    let to_leader = number(&failover, "time_to_new_leader_ms");
    assert!(to_leader > 0.0 && to_leader < 10_000.0, "{failover}");
    assert_eq!(failover["restarted"], true, "{failover}");
    // One paused follower of three, the others up: writes go on.
    assert!(
        number(&failover, "write_gap_during_pause_ms") < 2000.0,
        "{failover}"
    );

    // --out gathered one line per run.
    let lines = std::fs::read_to_string(out).expect("the results file");
    let scenarios: Vec<String> = lines
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).expect("a JSON line");
            v["scenario"].as_str().unwrap_or_default().to_string()
        })
        .collect();
    assert_eq!(
        scenarios,
        [
            "kv",
            "cas",
            "lease-grants",
            "sessions",
            "watch-fanout",
            "locks",
            "slow-watcher",
            "mass-expiry",
            "failover"
        ]
    );
    report_opens_in_chromium_with_its_plots(out, scenarios.len());
}

/// `report` makes one page of the results, and headless Chromium shows
/// every run's section with its plots (a latency-over-time plot per run,
/// a histogram per latency).
fn report_opens_in_chromium_with_its_plots(results: &Path, runs: usize) {
    let dir = tempfile::tempdir().expect("a directory");
    let page = dir.path().join("report.html");
    let made = loadtest(&["report", arg(results), "--output", arg(&page)]);
    assert!(made.status.success(), "{}", text(&made));
    let html = std::fs::read_to_string(&page).expect("the page");
    let plots = html.matches("<svg").count();
    // Every run has a series; every run has at least one latency.
    assert!(plots >= 2 * runs, "{plots} plots for {runs} runs");
    let chromium = match crate::common::chromium() {
        Ok(c) => c,
        Err(why) => {
            eprintln!("skipped: opening the report in Chromium: {why}");
            return;
        }
    };
    let url = format!("file://{}", arg(&page));
    let shown = std::process::Command::new(chromium)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--virtual-time-budget=2000",
            "--dump-dom",
            &url,
        ])
        .output()
        .expect("run chromium");
    assert!(shown.status.success(), "{}", text(&shown));
    let dom = String::from_utf8_lossy(&shown.stdout);
    // The DOM Chromium built: every section, every plot, drawn.
    for i in 0..runs {
        assert!(
            dom.contains(&format!("id=\"run-{i}\"")),
            "run {i} missing from the page"
        );
    }
    assert_eq!(dom.matches("<svg").count(), plots, "plots lost in Chromium");
    assert!(
        dom.matches("<polyline").count() >= runs,
        "no latency lines drawn"
    );
    assert!(
        dom.matches("<rect").count() > plots,
        "no histogram bars drawn"
    );
    assert!(dom.contains("latency over time"), "plot captions missing");
}

/// Every scenario that speaks only etcd's gRPC API runs unchanged against
/// etcd itself (found from the state file), and its safety counters hold
/// there too.
#[test]
fn the_grpc_scenarios_run_unchanged_against_etcd() {
    let cluster = UpCluster::start(&["--etcd"]);
    let results = tempfile::NamedTempFile::new().expect("a results file");
    let out = results.path();
    let small: [&[&str]; 8] = [
        &["kv", "--duration", "2s", "--clients", "8", "--keys", "50"],
        &[
            "cas",
            "--duration",
            "2s",
            "--clients",
            "8",
            "--counters",
            "2",
        ],
        &["lease-grants", "--duration", "2s", "--clients", "8"],
        &[
            "sessions",
            "--sessions",
            "300",
            "--ttl",
            "3",
            "--duration",
            "3s",
        ],
        &[
            "watch-fanout",
            "--watchers",
            "500",
            "--per-stream",
            "100",
            "--writes",
            "3",
            "--write-every",
            "100ms",
        ],
        &["locks", "--duration", "2s", "--contenders", "4"],
        &["slow-watcher", "--duration", "1s", "--writers", "4"],
        &[
            "mass-expiry",
            "--duration",
            "1s",
            "--leases",
            "100",
            "--ttl",
            "3",
            "--writers",
            "4",
        ],
    ];
    for args in small {
        let v = scenario_on(&cluster, "etcd", out, args);
        assert_eq!(v["errors"], 0, "{v}");
    }
    // Sessions over etcd are leases on keep-alive streams: all gRPC.
    let v = scenario_on(
        &cluster,
        "etcd",
        out,
        &[
            "sessions",
            "--sessions",
            "10",
            "--duration",
            "1s",
            "--ttl",
            "3",
        ],
    );
    assert_eq!(v["grpc_sessions"], 10, "{v}");
    // failover needs latchkey's processes; it says so.
    let refused = loadtest(&["failover", "--state", cluster.state()]);
    assert_eq!(refused.status.code(), Some(1), "{}", text(&refused));
    assert!(
        text(&refused).contains("needs a latchkey cell"),
        "{}",
        text(&refused)
    );
}

#[test]
fn bad_flags_and_a_missing_cluster_are_clear_errors() {
    let bad = loadtest(&["kv", "--writes", "2"]);
    assert_eq!(bad.status.code(), Some(2), "{}", text(&bad));
    assert!(
        text(&bad).contains("not a share between 0 and 1"),
        "{}",
        text(&bad)
    );

    let bad = loadtest(&["sessions", "--ttl", "1"]);
    assert_eq!(bad.status.code(), Some(2), "{}", text(&bad));

    let nowhere = tempfile::tempdir().expect("a temporary directory");
    let state = nowhere.path().join("none.json");
    let missing = loadtest(&["locks", "--state", arg(&state)]);
    assert_eq!(missing.status.code(), Some(1), "{}", text(&missing));
    assert!(
        text(&missing).contains("no cluster is up"),
        "{}",
        text(&missing)
    );

    let etcd_http = loadtest(&[
        "sessions",
        "--target",
        "etcd",
        "--cells",
        "127.0.0.1:1",
        "--api",
        "http",
    ]);
    assert_eq!(etcd_http.status.code(), Some(1), "{}", text(&etcd_http));
    assert!(
        text(&etcd_http).contains("etcd has no HTTP sessions"),
        "{}",
        text(&etcd_http)
    );
}

/// `compare` runs each workload on both systems, one after the other,
/// labels every result line with its workload, and tables one ratio per
/// figure for each (two workloads of one scenario apart).
#[test]
fn compare_runs_each_workload_on_both_systems_and_tables_the_ratios() {
    let latchkey = UpCluster::start(&["--cells", "1", "--proxies", "1"]);
    let etcd = UpCluster::start(&["--etcd", "--cells", "1"]);
    let results = tempfile::NamedTempFile::new().expect("a results file");
    let workloads = [
        "put",
        "serializable-range",
        "cas",
        "lease-grants",
        "sessions",
    ];
    let joined = workloads.join(",");
    let run = loadtest(&[
        "compare",
        "--latchkey-state",
        latchkey.state(),
        "--etcd-state",
        etcd.state(),
        "--workloads",
        &joined,
        "--duration",
        "1s",
        "--keys",
        "100",
        "--sessions",
        "100",
        "--session-ttl",
        "3",
        "--out",
        arg(results.path()),
    ]);
    assert!(run.status.success(), "{}", text(&run));
    let stdout = String::from_utf8_lossy(&run.stdout);
    for w in workloads {
        let row = stdout
            .lines()
            .find(|l| l.starts_with(&format!("| {w} | ")))
            .unwrap_or_else(|| panic!("no row for {w}:\n{stdout}"));
        assert!(row.split('|').count() >= 6, "{row}");
    }
    let lines = std::fs::read_to_string(results.path()).expect("the results file");
    let labelled: Vec<(String, String)> = lines
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).expect("a JSON line");
            let field = |f: &str| v[f].as_str().unwrap_or_default().to_string();
            (field("workload"), field("target"))
        })
        .collect();
    let expected: Vec<(String, String)> = workloads
        .iter()
        .flat_map(|w| ["latchkey", "etcd"].map(|t| (w.to_string(), t.to_string())))
        .collect();
    assert_eq!(labelled, expected);

    let unknown = loadtest(&["compare", "--workloads", "put,nonsense"]);
    assert_eq!(unknown.status.code(), Some(2), "{}", text(&unknown));
    assert!(text(&unknown).contains("nonsense"), "{}", text(&unknown));
}
