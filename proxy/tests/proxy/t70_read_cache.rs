//! The serializable read cache is coherent (issue 12, Done-when 4): reads
//! through the proxy, interleaved at random with writes straight to the
//! cell, each equal the cell's own answer at the revision they report; a
//! client's revisions never go backwards; a linearizable read after an
//! acknowledged write sees it; and the cache did answer some of them.

use crate::{member_addrs, proxy_bin};
use etcd_client::{Client, GetOptions, GetResponse};
use latchkey_testkit::{cell_binary, Cluster, ProxyProcess};
use std::time::Duration;

/// A small seeded generator: the run is reproducible from its seed.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// One key-value as compared: key, value, create, mod revision, version.
type Kv = (String, String, i64, i64, i64);

/// What a read returned, comparable field by field.
fn shape(resp: &GetResponse) -> (Vec<Kv>, i64, bool) {
    let kvs = resp
        .kvs()
        .iter()
        .map(|kv| {
            (
                String::from_utf8_lossy(kv.key()).into_owned(),
                String::from_utf8_lossy(kv.value()).into_owned(),
                kv.create_revision(),
                kv.mod_revision(),
                kv.version(),
            )
        })
        .collect();
    (kvs, resp.count(), resp.more())
}

fn revision(resp: &GetResponse) -> i64 {
    resp.header().map_or(0, |h| h.revision())
}

/// One of the ranges the test reads: a key, the prefix of all, or a
/// prefix with a limit.
fn read_options(which: u64) -> (String, GetOptions) {
    match which {
        0..=5 => (format!("c/{which}"), GetOptions::new()),
        6 => ("c/".to_string(), GetOptions::new().with_prefix()),
        _ => (
            "c/".to_string(),
            GetOptions::new().with_prefix().with_limit(3),
        ),
    }
}

/// A 3-member cell, a proxy before it, a client of the cell's leader and
/// one of the proxy.
async fn cell_and_proxy() -> (Cluster, ProxyProcess, Client, Client) {
    let cluster = Cluster::start(cell_binary(), 3, &[]).await;
    let leader = cluster.wait_leader(Duration::from_secs(20)).await;
    let proxy = ProxyProcess::start(proxy_bin(), &member_addrs(&cluster), &[]).await;
    let cell = cluster.client(leader).await;
    let through_proxy = Client::connect([format!("http://{}", proxy.grpc)], None)
        .await
        .expect("connect to the proxy");
    (cluster, proxy, cell, through_proxy)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cached_reads_equal_the_cells_answer_at_their_revision_and_never_go_back() {
    let (_cluster, proxy, mut cell, mut through_proxy) = cell_and_proxy().await;
    let seed = std::env::var("LATCHKEY_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed_cafe_u64);
    eprintln!("seed {seed} (LATCHKEY_TEST_SEED reruns it)");
    let mut rng = Rng(seed);
    let mut last_seen = 0;
    let (mut reads, mut writes) = (0, 0);
    for step in 0..600 {
        if step % 50 == 49 {
            // Quiet a while: the cached ranges catch up by progress alone.
            tokio::time::sleep(Duration::from_millis(400)).await;
        }
        let key = format!("c/{}", rng.below(6));
        match rng.below(10) {
            // Writes go straight to the cell, never through the proxy.
            0..=2 => {
                let acked = if rng.below(4) == 0 {
                    cell.delete(key.as_str(), None)
                        .await
                        .expect("delete")
                        .header()
                        .map_or(0, |h| h.revision())
                } else {
                    let value = format!("v{step}");
                    cell.put(key.as_str(), value.as_str(), None)
                        .await
                        .expect("put")
                        .header()
                        .map_or(0, |h| h.revision())
                };
                writes += 1;
                // A linearizable read through the proxy sees it.
                let after = through_proxy.get(key.as_str(), None).await.expect("get");
                assert!(
                    revision(&after) >= acked,
                    "step {step}: a linearizable read at {} after a write acknowledged at {acked}",
                    revision(&after)
                );
                if let Some(kv) = after.kvs().first() {
                    assert!(kv.mod_revision() <= revision(&after));
                }
                last_seen = last_seen.max(revision(&after));
            }
            _ => {
                let (key, options) = read_options(rng.below(8));
                let got = through_proxy
                    .get(key.as_str(), Some(options.clone().with_serializable()))
                    .await
                    .expect("serializable get");
                let at = revision(&got);
                assert!(
                    at >= last_seen,
                    "step {step}: revision went back from {last_seen} to {at}"
                );
                last_seen = at;
                let truth = cell
                    .get(key.as_str(), Some(options.with_revision(at)))
                    .await
                    .expect("the cell's read at that revision");
                assert_eq!(
                    shape(&got),
                    shape(&truth),
                    "step {step}: {key} through the proxy at revision {at} differs from the cell's"
                );
                reads += 1;
            }
        }
    }
    let hits = proxy
        .metric("latchkey_proxy_cache_hits_total")
        .await
        .unwrap_or(0.0);
    let misses = proxy
        .metric("latchkey_proxy_cache_misses_total")
        .await
        .unwrap_or(0.0);
    eprintln!("{reads} reads, {writes} writes; cache hits {hits}, misses {misses}");
    assert!(hits > 0.0, "the cache answered nothing ({misses} misses)");
}

/// A cached range nobody writes keeps answering from the cache at the
/// cell's newer revisions: its shared watch's progress carries it past
/// writes to other keys, so serializable reads of quiet keys stay both
/// fresh and cheap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiet_cached_range_answers_from_the_cache_at_newer_revisions() {
    let (_cluster, proxy, mut cell, mut through_proxy) = cell_and_proxy().await;
    let serializable = || Some(GetOptions::new().with_serializable());
    cell.put("quiet/k", "still", None).await.expect("put");
    for _ in 0..3 {
        through_proxy
            .get("quiet/k", serializable())
            .await
            .expect("warm the cache");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let hits = || async {
        proxy
            .metric("latchkey_proxy_cache_hits_total")
            .await
            .unwrap_or(0.0)
    };
    for round in 0..3 {
        let written = cell
            .put("busy/k", format!("{round}"), None)
            .await
            .expect("put another key")
            .header()
            .map_or(0, |h| h.revision());
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let before = hits().await;
            let got = through_proxy
                .get("quiet/k", serializable())
                .await
                .expect("serializable get");
            let from_cache = hits().await > before;
            assert_eq!(
                got.kvs().first().map(|kv| kv.value_str().unwrap_or("")),
                Some("still")
            );
            if from_cache && revision(&got) >= written {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "round {round}: after 10 s the cache still answers quiet/k below revision \
                 {written} (last answer at {}, from the cache: {from_cache})",
                revision(&got)
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// The read that admits a range into the cache fills it when its answer
/// holds the whole range; an answer a limit cut short does not: the range
/// is read whole, so a later read without the limit gets every key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_range_admitted_by_a_read_with_a_limit_is_cached_whole() {
    let (_cluster, proxy, mut cell, mut through_proxy) = cell_and_proxy().await;
    // Written through the proxy: this client's serializable reads are then
    // answered at or after its writes, whichever member answers.
    for i in 0..5 {
        through_proxy
            .put(format!("lim/{i}"), "v", None)
            .await
            .expect("put");
    }
    let limited = || {
        Some(
            GetOptions::new()
                .with_prefix()
                .with_limit(2)
                .with_serializable(),
        )
    };
    for _ in 0..2 {
        let got = through_proxy.get("lim/", limited()).await.expect("get");
        assert_eq!((got.kvs().len(), got.count(), got.more()), (2, 5, true));
    }
    let hits = || async {
        proxy
            .metric("latchkey_proxy_cache_hits_total")
            .await
            .unwrap_or(0.0)
    };
    let all = || GetOptions::new().with_prefix();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let before = hits().await;
        let got = through_proxy
            .get("lim/", Some(all().with_serializable()))
            .await
            .expect("serializable get");
        let truth = cell
            .get("lim/", Some(all().with_revision(revision(&got))))
            .await
            .expect("the cell's read at that revision");
        assert_eq!(
            shape(&got),
            shape(&truth),
            "the whole prefix through the proxy"
        );
        if hits().await > before {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "after 10 s the cache still does not answer the prefix"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// P3, read-your-writes: on one connection, a serializable read after the
/// client's own write is at or past the write's revision and shows it,
/// whether the cache, a follower or the leader answers. Over gRPC the
/// connection is the client's channel; over HTTP the kept-alive
/// connection of one HTTP client (the floor is per connection).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_serializable_read_after_a_clients_own_write_sees_it() {
    let cluster = Cluster::start(cell_binary(), 3, &[]).await;
    cluster.wait_leader(Duration::from_secs(20)).await;
    let proxy = ProxyProcess::start(proxy_bin(), &member_addrs(&cluster), &[]).await;
    let mut grpc = Client::connect([format!("http://{}", proxy.grpc)], None)
        .await
        .expect("connect to the proxy");
    // One HTTP connection, kept alive between requests: a client library's
    // pool may open another at any time, and the floor is per connection.
    let mut http = OneConnection::open(&proxy.http).await;
    let serializable = || Some(GetOptions::new().with_serializable());
    // The cache holds both keys once a serializable read of each missed.
    for key in ["ryw/grpc", "ryw/http"] {
        grpc.put(key, "0", None).await.expect("put");
        for _ in 0..3 {
            grpc.get(key, serializable()).await.expect("warm the cache");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    let hits_before = proxy
        .metric("latchkey_proxy_cache_hits_total")
        .await
        .unwrap_or(0.0);
    for i in 1..=200 {
        let value = i.to_string();
        let put = grpc
            .put("ryw/grpc", value.as_str(), None)
            .await
            .expect("put");
        let acked = put.header().map_or(0, |h| h.revision());
        let got = grpc.get("ryw/grpc", serializable()).await.expect("get");
        assert!(
            revision(&got) >= acked,
            "gRPC step {i}: a serializable read at {} after the client's own put at {acked}",
            revision(&got)
        );
        assert_eq!(
            got.kvs().first().map(|kv| kv.value_str().unwrap_or("")),
            Some(value.as_str())
        );

        let put = http.call("PUT", "/v1/kv/ryw/http", &value).await;
        let acked = put["revision"].as_i64().expect("a revision");
        let got = http
            .call("GET", "/v1/kv/ryw/http?serializable=true", "")
            .await;
        assert!(
            got["revision"].as_i64().unwrap_or(0) >= acked,
            "HTTP step {i}: a serializable read after the client's own put at {acked}: {got}"
        );
    }
    let hits = proxy
        .metric("latchkey_proxy_cache_hits_total")
        .await
        .unwrap_or(0.0);
    eprintln!("cache hits during the loop: {}", hits - hits_before);
}

/// HTTP/1.1 requests one after another on one kept-alive TCP connection.
struct OneConnection {
    stream: tokio::io::BufReader<tokio::net::TcpStream>,
    host: String,
}

impl OneConnection {
    async fn open(addr: &str) -> OneConnection {
        let stream = tokio::net::TcpStream::connect(addr)
            .await
            .expect("connect to the proxy's HTTP address");
        OneConnection {
            stream: tokio::io::BufReader::new(stream),
            host: addr.to_string(),
        }
    }

    /// One request; its JSON answer, which must be a 200.
    async fn call(&mut self, method: &str, path: &str, body: &str) -> serde_json::Value {
        use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
        let request = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nContent-Length: {}\r\n\r\n{body}",
            self.host,
            body.len()
        );
        let stream = self.stream.get_mut();
        stream.write_all(request.as_bytes()).await.expect("send");
        let mut status = String::new();
        self.stream
            .read_line(&mut status)
            .await
            .expect("status line");
        assert!(
            status.starts_with("HTTP/1.1 200"),
            "{method} {path}: {status}"
        );
        let mut length = 0;
        loop {
            let mut line = String::new();
            self.stream.read_line(&mut line).await.expect("a header");
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            if let Some((name, value)) = line.split_once(':') {
                if name.eq_ignore_ascii_case("content-length") {
                    length = value.trim().parse().expect("a length");
                }
            }
        }
        let mut answer = vec![0; length];
        self.stream.read_exact(&mut answer).await.expect("the body");
        serde_json::from_slice(&answer).expect("a JSON answer")
    }
}
