//! Lock holders as separate processes, and the fenced resource they write
//! to: the fencing check of the lock tests and of the chaos suite.
//!
//! Each holder is a `sh` loop of `curl` calls through a proxy's HTTP API,
//! in its own process group so it can be paused (SIGSTOP) as a whole, like
//! a client in a long GC pause: open a session (1 s TTL) kept alive in the
//! background, acquire the lock, write three times to the resource with
//! the fencing token, release, again and again. The resource
//! ([`FencedLog`]) is a `FencedResource` behind a small HTTP server that
//! records every write and whether it was accepted.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use latchkey_shared::lock::FencedResource;
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};

/// The session TTL of every holder, in seconds.
pub const HOLDER_TTL_SECS: u64 = 1;

const HOLDER: &str = r#"
while true; do
  S=$(curl -s -m 5 -X POST -d '{"ttl": 1}' "$PROXY/v1/sessions" | sed -n 's/.*"id":"\([0-9a-f]*\)".*/\1/p')
  [ -z "$S" ] && { sleep 0.1; continue; }
  ( while true; do curl -s -m 2 -o /dev/null -X POST "$PROXY/v1/sessions/$S/keepalive"; sleep 0.2; done ) &
  KA=$!
  T=$(curl -s -m 25 -X POST -d "{\"session_id\": \"$S\", \"timeout_ms\": 20000}" "$PROXY/v1/locks/$LOCK/acquire" | sed -n 's/.*"fencing_token":\([0-9]*\).*/\1/p')
  if [ -n "$T" ]; then
    for i in 1 2 3; do
      curl -s -m 5 -o /dev/null -X POST "$RESOURCE/write/$$/$T"
      sleep 0.03
    done
    curl -s -m 5 -o /dev/null -X POST -d "{\"session_id\": \"$S\"}" "$PROXY/v1/locks/$LOCK/release"
  fi
  kill $KA 2>/dev/null
done
"#;

/// One write the resource saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FencedWrite {
    /// The holder's process id.
    pub holder: u32,
    pub token: i64,
    pub accepted: bool,
    /// When the resource decided it.
    pub at: std::time::Instant,
}

/// The fenced resource and every write it saw, in the order decided.
#[derive(Default)]
pub struct FencedLog {
    fenced: FencedResource,
    writes: Mutex<Vec<FencedWrite>>,
}

/// What [`FencedLog::check`] found in a log that holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FencedSummary {
    /// Grants seen (distinct tokens accepted).
    pub grants: usize,
    pub accepted: usize,
    pub stale_refused: usize,
}

async fn write(
    State(log): State<Arc<FencedLog>>,
    Path((holder, token)): Path<(u32, i64)>,
) -> StatusCode {
    // The check and the record are one step: the order recorded is the
    // order decided.
    let mut writes = log.writes.lock().unwrap_or_else(|p| p.into_inner());
    let accepted = log.fenced.accept("resource", token).is_ok();
    writes.push(FencedWrite {
        holder,
        token,
        accepted,
        at: std::time::Instant::now(),
    });
    if accepted {
        StatusCode::OK
    } else {
        StatusCode::CONFLICT
    }
}

impl FencedLog {
    /// Serves `POST /write/{holder}/{token}` on a free loopback port until
    /// the runtime ends; the log and the address.
    pub async fn serve() -> (Arc<FencedLog>, SocketAddr) {
        let log = Arc::new(FencedLog::default());
        let app = axum::Router::new()
            .route("/write/{holder}/{token}", axum::routing::post(write))
            .with_state(log.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the fenced resource");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move { axum::serve(listener, app).await });
        (log, addr)
    }

    pub fn writes(&self) -> Vec<FencedWrite> {
        self.writes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Distinct tokens accepted so far: completed grants.
    pub fn grants(&self) -> usize {
        let mut tokens: Vec<i64> = self
            .writes()
            .iter()
            .filter(|w| w.accepted)
            .map(|w| w.token)
            .collect();
        tokens.dedup();
        tokens.len()
    }

    /// The holder whose write was accepted last (most likely the holder).
    pub fn last_writer(&self) -> Option<u32> {
        self.writes()
            .iter()
            .rev()
            .find(|w| w.accepted)
            .map(|w| w.holder)
    }

    /// At most one holder at a time: never a lower token accepted after a
    /// higher one, and one unbroken run of accepted writes per grant (a
    /// token belongs to one holder, and once its run ends nobody writes
    /// under it again).
    pub fn check(&self) -> Result<FencedSummary, String> {
        let writes = self.writes();
        let accepted: Vec<(u32, i64)> = writes
            .iter()
            .filter(|w| w.accepted)
            .map(|w| (w.holder, w.token))
            .collect();
        if let Some(w) = accepted.windows(2).find(|w| w[0].1 > w[1].1) {
            return Err(format!("token {} accepted after token {}", w[1].1, w[0].1));
        }
        let mut runs = accepted.clone();
        runs.dedup();
        let mut tokens: Vec<i64> = runs.iter().map(|r| r.1).collect();
        tokens.dedup();
        if tokens.len() != runs.len() {
            return Err(format!(
                "two holders wrote under one token, or a holder's writes were interleaved \
                 with another's ({} runs of writes for {} tokens)",
                runs.len(),
                tokens.len()
            ));
        }
        Ok(FencedSummary {
            grants: tokens.len(),
            accepted: accepted.len(),
            stale_refused: writes.len() - accepted.len(),
        })
    }
}

/// The holder processes, each its own process group; killed (with every
/// process of the group) and reaped when dropped.
pub struct Holders(Vec<Child>);

impl Holders {
    /// Starts `n` holders of lock `lock` through the proxy whose HTTP API
    /// is at `proxy_http`, writing to the resource at `resource`.
    pub fn start(n: usize, proxy_http: &str, lock: &str, resource: SocketAddr) -> Holders {
        let mut children = Vec::new();
        for _ in 0..n {
            let child = Command::new("sh")
                .args(["-c", HOLDER])
                .env("PROXY", format!("http://{proxy_http}"))
                .env("RESOURCE", format!("http://{resource}"))
                .env("LOCK", lock)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .process_group(0)
                .spawn()
                .expect("start a holder");
            children.push(child);
        }
        Holders(children)
    }

    pub fn pids(&self) -> Vec<u32> {
        self.0.iter().map(Child::id).collect()
    }

    /// Sends `signal` (`"STOP"`, `"CONT"`, ...) to holder `pid`'s whole
    /// process group.
    pub fn signal(&self, pid: u32, signal: &str) {
        let _ = Command::new("kill")
            .args([&format!("-{signal}"), "--", &format!("-{pid}")])
            .status();
    }
}

impl Drop for Holders {
    fn drop(&mut self) {
        for pid in self.pids() {
            self.signal(pid, "CONT");
            self.signal(pid, "KILL");
        }
        for child in &mut self.0 {
            let _ = child.wait();
        }
    }
}
