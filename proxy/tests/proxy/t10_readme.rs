//! The README's examples, parsed from README.md (not copied here), run
//! against `latchkey-proxy --dev` in order, each output compared with
//! the one the README shows.
//!
//! An example is a `console` block line `$ curl ...` or `$ etcdctl ...`;
//! the lines after it, up to the next `$ ` line or the block's end, are its
//! output. JSON outputs are compared as JSON, others line by line; an
//! example shown without output must succeed and print something. The
//! README's addresses (the default ports) are replaced by the test
//! proxy's.

use crate::proxy_bin;
use latchkey_testkit::ProxyProcess;
use std::process::Stdio;
use tokio::time::{timeout, Duration};

struct Example {
    line: usize,
    command: String,
    output: Vec<String>,
}

fn examples(readme: &str) -> Vec<Example> {
    let mut found = Vec::new();
    let mut in_console = false;
    for (n, line) in readme.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            in_console = !in_console && line.trim() == "```console";
            continue;
        }
        if !in_console {
            continue;
        }
        if let Some(command) = line.strip_prefix("$ ") {
            found.push(Example {
                line: n + 1,
                command: command.to_string(),
                output: Vec::new(),
            });
        } else if let Some(example) = found.last_mut() {
            example.output.push(line.to_string());
        }
    }
    found
}

async fn run(command: &str) -> (Option<i32>, String) {
    let child = tokio::process::Command::new("sh")
        .args(["-c", command])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("sh");
    let out = timeout(Duration::from_secs(30), child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("{command} ran over 30 s"))
        .expect("output");
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    (out.status.code(), text)
}

/// Whether `got` is what the README shows. An example shown without an
/// output (its output depends on the run: ports, time left) only has to
/// succeed and print something.
fn same_output(expected: &[String], got: &str) -> bool {
    if expected.iter().all(|l| l.trim().is_empty()) {
        return !got.trim().is_empty();
    }
    let expected = expected.join("\n");
    if let (Ok(a), Ok(b)) = (
        serde_json::from_str::<serde_json::Value>(&expected),
        serde_json::from_str::<serde_json::Value>(got.trim()),
    ) {
        return a == b;
    }
    let want: Vec<&str> = expected
        .lines()
        .map(str::trim_end)
        .filter(|l| !l.is_empty())
        .collect();
    let have: Vec<&str> = got
        .lines()
        .map(str::trim_end)
        .filter(|l| !l.is_empty())
        .collect();
    want == have
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_readme_example_works_and_prints_what_the_readme_shows() {
    let readme_path = concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md");
    let readme = std::fs::read_to_string(readme_path).expect("README.md");
    let examples = examples(&readme);
    let curls = examples
        .iter()
        .filter(|e| e.command.starts_with("curl "))
        .count();
    assert!(
        curls >= 8,
        "the README shows {curls} curl examples; expected the API tour"
    );
    let proxy = ProxyProcess::dev(proxy_bin()).await;
    for example in &examples {
        let command = example
            .command
            .replace("127.0.0.1:7700", &proxy.http)
            .replace("127.0.0.1:7701", &proxy.grpc)
            .replace("127.0.0.1:7711", &proxy.metrics);
        assert!(
            command.starts_with("curl ") || command.starts_with("etcdctl "),
            "README.md:{}: only curl and etcdctl examples are run: {}",
            example.line,
            example.command
        );
        let (code, output) = run(&command).await;
        // A stream example ends by its own --max-time (curl's exit 28).
        let ended_well = code == Some(0) || (code == Some(28) && command.contains("--max-time"));
        assert!(
            ended_well,
            "README.md:{}: {} exited {code:?}: {output}",
            example.line, example.command
        );
        assert!(
            same_output(&example.output, &output),
            "README.md:{}: {}\n  the README shows:\n{}\n  it printed:\n{output}",
            example.line,
            example.command,
            example.output.join("\n")
        );
    }
}

#[test]
fn outputs_are_compared_as_json_or_line_by_line() {
    let json = vec![r#"{"a": 1, "b": [2]}"#.to_string()];
    assert!(same_output(&json, "{\"b\":[2],\"a\":1}\n"));
    assert!(!same_output(&json, "{\"b\":[2],\"a\":2}"));
    let lines = vec!["event: put".to_string(), "id: 2".to_string()];
    assert!(same_output(&lines, "event: put\nid: 2\n\n"));
    assert!(!same_output(&lines, "event: put\nid: 3\n"));
    assert!(same_output(&[], "{\"ttl\": 29}"));
    assert!(!same_output(&[], ""));
}
