//! Fencing under pauses (issue 13, Done-when 3): three holder processes
//! take turns with one lock over HTTP, each writing to a fenced resource
//! with its token while it holds the lock. The test SIGSTOPs the current
//! holder past its session's TTL, so the lock passes on, then SIGCONTs it:
//! it goes on writing with its old token, as a paused process would. The
//! resource (a `FencedResource` behind a tiny HTTP server in this test)
//! must never accept a lower token than one it accepted, and the accepted
//! writes must come in one unbroken run per holder; stale writes must have
//! been refused (proof that the pauses bit).

use crate::{member_addrs, proxy_bin};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use latchkey_shared::lock::FencedResource;
use latchkey_testkit::{cell_binary, Cluster, ProxyProcess};
use std::os::unix::process::CommandExt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

const ROUNDS: usize = 200;
const HOLDERS: usize = 3;
/// Longer than the sessions' 1 s TTL, with room for the expiry to land.
const PAUSE: Duration = Duration::from_millis(2500);

/// A holder: a session kept alive in the background, the lock, three
/// writes with its token, release; again and again.
const HOLDER: &str = r#"
while true; do
  S=$(curl -s -X POST -d '{"ttl": 1}' "$PROXY/v1/sessions" | sed -n 's/.*"id":"\([0-9a-f]*\)".*/\1/p')
  [ -z "$S" ] && { sleep 0.1; continue; }
  ( while true; do curl -s -o /dev/null -X POST "$PROXY/v1/sessions/$S/keepalive"; sleep 0.2; done ) &
  KA=$!
  T=$(curl -s -X POST -d "{\"session_id\": \"$S\", \"timeout_ms\": 20000}" "$PROXY/v1/locks/fenced/acquire" | sed -n 's/.*"fencing_token":\([0-9]*\).*/\1/p')
  if [ -n "$T" ]; then
    for i in 1 2 3; do
      curl -s -o /dev/null -X POST "$RESOURCE/write/$$/$T"
      sleep 0.03
    done
    curl -s -o /dev/null -X POST -d "{\"session_id\": \"$S\"}" "$PROXY/v1/locks/fenced/release"
  fi
  kill $KA 2>/dev/null
done
"#;

/// Every write the resource saw: holder, token, accepted.
#[derive(Default)]
struct Resource {
    fenced: FencedResource,
    writes: Mutex<Vec<(u32, i64, bool)>>,
}

async fn write(
    State(resource): State<Arc<Resource>>,
    Path((holder, token)): Path<(u32, i64)>,
) -> StatusCode {
    // The check and the record are one step: the order recorded is the
    // order decided.
    let mut writes = resource.writes.lock().expect("lock");
    let accepted = resource.fenced.accept("resource", token).is_ok();
    writes.push((holder, token, accepted));
    if accepted {
        StatusCode::OK
    } else {
        StatusCode::CONFLICT
    }
}

/// The holder processes, each its own process group; killed (with every
/// process of the group) and reaped when dropped.
struct Holders(Vec<std::process::Child>);

impl Holders {
    fn pids(&self) -> Vec<u32> {
        self.0.iter().map(std::process::Child::id).collect()
    }

    fn signal(&self, pid: u32, signal: &str) {
        let _ = std::process::Command::new("kill")
            .args([signal, "--", &format!("-{pid}")])
            .status();
    }
}

impl Drop for Holders {
    fn drop(&mut self) {
        for pid in self.pids() {
            self.signal(pid, "-CONT");
            self.signal(pid, "-KILL");
        }
        for child in &mut self.0 {
            let _ = child.wait();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_holders_past_their_ttl_are_fenced_off_by_their_tokens() {
    let cluster = Cluster::start(cell_binary(), 3, &["--min-ttl", "1"]).await;
    let proxy = ProxyProcess::start(
        proxy_bin(),
        &member_addrs(&cluster),
        &["--refresh-tick", "100ms"],
    )
    .await;
    let resource = Arc::new(Resource::default());
    let app = axum::Router::new()
        .route("/write/{holder}/{token}", axum::routing::post(write))
        .with_state(resource.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let resource_addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await });

    let mut children = Vec::new();
    for _ in 0..HOLDERS {
        let child = std::process::Command::new("sh")
            .args(["-c", HOLDER])
            .env("PROXY", format!("http://{}", proxy.http))
            .env("RESOURCE", format!("http://{resource_addr}"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .process_group(0)
            .spawn()
            .expect("start a holder");
        children.push(child);
    }
    let holders = Holders(children);

    let rounds = || {
        let writes = resource.writes.lock().expect("lock");
        let mut tokens: Vec<i64> = writes.iter().filter(|w| w.2).map(|w| w.1).collect();
        tokens.dedup();
        tokens.len()
    };
    let started = tokio::time::Instant::now();
    let mut pauses = 0;
    while rounds() < ROUNDS {
        assert!(
            started.elapsed() < Duration::from_secs(240),
            "only {} rounds in 4 minutes",
            rounds()
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
        // Pause whoever wrote last (most likely the holder) past its TTL.
        let last = resource
            .writes
            .lock()
            .expect("lock")
            .iter()
            .rev()
            .find(|w| w.2)
            .map(|w| w.0);
        if let Some(pid) = last.filter(|pid| holders.pids().contains(pid)) {
            holders.signal(pid, "-STOP");
            tokio::time::sleep(PAUSE).await;
            holders.signal(pid, "-CONT");
            pauses += 1;
        }
    }
    drop(holders);

    let writes = resource.writes.lock().expect("lock").clone();
    let accepted: Vec<(u32, i64)> = writes.iter().filter(|w| w.2).map(|w| (w.0, w.1)).collect();
    let stale = writes.len() - accepted.len();
    eprintln!(
        "{} rounds, {} writes accepted, {stale} stale writes refused, {pauses} pauses",
        rounds(),
        accepted.len()
    );
    // Never a lower token after a higher one, and one unbroken run per
    // holder's grant: a token belongs to one holder, and once a holder's
    // run ends it never writes again under that token.
    assert!(accepted.windows(2).all(|w| w[0].1 <= w[1].1));
    let mut runs: Vec<(u32, i64)> = accepted.clone();
    runs.dedup();
    let mut tokens: Vec<i64> = runs.iter().map(|r| r.1).collect();
    tokens.dedup();
    assert_eq!(
        tokens.len(),
        runs.len(),
        "two holders wrote under one token, or a holder's writes were interleaved with another's"
    );
    assert!(
        stale > 0,
        "no stale write was refused: the pauses did not bite"
    );
}
