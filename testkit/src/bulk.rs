//! Many keys and leases at once, and counting them.

use etcd_client::{Client, GetOptions, PutOptions, Txn, TxnOp};
use futures::StreamExt;
use latchkey_shared::{classify_call_failure, Retry};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use tokio::time::{sleep, Duration, Instant};

/// Requests in flight for the bulk helpers: enough to batch well in the
/// cell, few enough that a 2-core machine still schedules the members.
pub const IN_FLIGHT: usize = 64;

/// Puts per transaction in [`attach_keys`] (the cell's `--max-txn-ops`
/// default, like etcd's, is 128).
const PUTS_PER_TXN: usize = 128;

/// Times [`attach_keys`] sends one transaction whose answer was a timeout
/// or an unavailable cell, and the pause before each retry.
const ATTACH_ATTEMPTS: usize = 5;
const ATTACH_RETRY_PAUSE: Duration = Duration::from_millis(500);

/// `n` numbered keys `{prefix}{i:06}` (i in `0..n`), each with `value`.
pub fn numbered(prefix: &str, n: usize, value: &str) -> Vec<(String, String)> {
    (0..n)
        .map(|i| (format!("{prefix}{i:06}"), value.to_string()))
        .collect()
}

/// Puts every `(key, value)`, [`IN_FLIGHT`] at a time; panics on the first
/// failure. Returns what was written, to compare with what members hold
/// later.
pub async fn put_all(
    client: &Client,
    kvs: impl IntoIterator<Item = (String, String)>,
) -> BTreeMap<String, String> {
    futures::stream::iter(kvs)
        .map(|(key, value)| {
            let mut c = client.clone();
            async move {
                match c.put(key.as_str(), value.as_str(), None).await {
                    Ok(_) => (key, value),
                    Err(e) => panic!("put {key:?}: {e}"),
                }
            }
        })
        .buffer_unordered(IN_FLIGHT)
        .collect()
        .await
}

/// How many keys start with `prefix` (a linearizable count-only read).
pub async fn count_keys(client: &Client, prefix: &str) -> i64 {
    client
        .clone()
        .get(
            prefix,
            Some(GetOptions::new().with_prefix().with_count_only()),
        )
        .await
        .unwrap_or_else(|e| panic!("count keys under {prefix:?}: {e}"))
        .count()
}

/// Grants `n` leases of `ttl` seconds, [`IN_FLIGHT`] at a time; their ids.
pub async fn grant_leases(client: &Client, n: usize, ttl: i64) -> Vec<i64> {
    futures::stream::iter(0..n)
        .map(|_| {
            let mut c = client.clone();
            async move {
                c.lease_grant(ttl, None)
                    .await
                    .unwrap_or_else(|e| panic!("grant a {ttl} s lease: {e}"))
                    .id()
            }
        })
        .buffer_unordered(IN_FLIGHT)
        .collect()
        .await
}

/// Puts one key `{prefix}{lease:x}` on each lease, 128 puts per txn.
pub async fn attach_keys(client: &Client, prefix: &str, leases: &[i64]) {
    let txns: Vec<Txn> = leases
        .chunks(PUTS_PER_TXN)
        .map(|chunk| {
            Txn::new().and_then(
                chunk
                    .iter()
                    .map(|id| {
                        TxnOp::put(
                            format!("{prefix}{id:x}"),
                            "x",
                            Some(PutOptions::new().with_lease(*id)),
                        )
                    })
                    .collect::<Vec<_>>(),
            )
        })
        .collect();
    futures::stream::iter(txns)
        .map(|t| {
            let mut c = client.clone();
            async move {
                let mut attempt = 1;
                loop {
                    match c.txn(t.clone()).await {
                        Ok(_) => return,
                        Err(e) if attempt < ATTACH_ATTEMPTS && may_retry(&e) => {
                            println!(
                                "attaching keys under {prefix:?} (attempt {attempt}): {e}; again"
                            );
                            attempt += 1;
                            sleep(ATTACH_RETRY_PAUSE).await;
                        }
                        Err(e) => panic!("attaching keys to leases under {prefix:?}: {e}"),
                    }
                }
            }
        })
        .buffer_unordered(IN_FLIGHT / 2)
        .collect::<Vec<()>>()
        .await;
}

/// Whether a failed call may be sent again because putting the same keys
/// on the same leases twice changes nothing: the cell was unavailable,
/// or the outcome is unknown (a timeout, a leader change). Verdicts on the
/// request itself are not retried.
fn may_retry(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::GRpcStatus(status) => {
            classify_call_failure(status).retry() != Retry::Never
        }
        _ => false,
    }
}

/// Grants `n` leases of `ttl` seconds with a key `{prefix}{id:x}` each,
/// calling `refresh` every second meanwhile with every lease granted so
/// far, so none expires before the caller takes over (granting 100 000
/// takes longer than a TTL). `refresh` answers per lease its TTL, or -1 if
/// gone; every lease must be alive each time.
///
/// `refresh` is whatever client the caller tests (a batched refresh
/// stream, a keep-alive stream, a proxy session).
pub async fn grant_kept_alive(
    client: &Client,
    n: usize,
    ttl: i64,
    prefix: &str,
    mut refresh: impl AsyncFnMut(&[i64]) -> Result<Vec<i64>, String>,
) -> Vec<i64> {
    let granted = Arc::new(Mutex::new(Vec::with_capacity(n)));
    let grants = tokio::spawn({
        let client = client.clone();
        let granted = granted.clone();
        async move {
            futures::stream::iter(0..n)
                .map(|_| {
                    let mut c = client.clone();
                    let granted = granted.clone();
                    async move {
                        let id = c
                            .lease_grant(ttl, None)
                            .await
                            .unwrap_or_else(|e| panic!("grant a {ttl} s lease: {e}"))
                            .id();
                        granted.lock().unwrap_or_else(|e| e.into_inner()).push(id);
                    }
                })
                .buffer_unordered(IN_FLIGHT)
                .collect::<Vec<()>>()
                .await;
        }
    });
    let granted_so_far = || granted.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let ttl_secs = Duration::from_secs(ttl.max(0) as u64);
    keep_alive_until_done(&grants, &mut refresh, granted_so_far, ttl_secs, "granting").await;
    grants.await.expect("granting leases");
    let leases = granted_so_far();
    let attach = tokio::spawn({
        let client = client.clone();
        let prefix = prefix.to_string();
        let leases = leases.clone();
        async move { attach_keys(&client, &prefix, &leases).await }
    });
    keep_alive_until_done(
        &attach,
        &mut refresh,
        || leases.clone(),
        ttl_secs,
        "attaching keys",
    )
    .await;
    attach.await.expect("attaching keys");
    leases
}

/// Refreshes `ids()` every second until `task` finishes; every lease must
/// still be alive each time. A refresh that fails (a leader change under
/// load, a timed-out request) is tried again the next second, as any
/// client would, but refreshes failing for `ttl` fail the caller: the
/// leases would be expiring.
async fn keep_alive_until_done<T>(
    task: &tokio::task::JoinHandle<T>,
    refresh: &mut impl AsyncFnMut(&[i64]) -> Result<Vec<i64>, String>,
    ids: impl Fn() -> Vec<i64>,
    ttl: Duration,
    what: &str,
) {
    let mut refreshed = Instant::now();
    while !task.is_finished() {
        sleep(Duration::from_secs(1)).await;
        match refresh(&ids()).await {
            Ok(ttls) => {
                let gone = ttls.iter().filter(|t| **t <= 0).count();
                assert_eq!(gone, 0, "{gone} leases expired while {what}");
                refreshed = Instant::now();
            }
            Err(e) if refreshed.elapsed() < ttl => {
                println!("refresh while {what} failed ({e}); again in a second");
            }
            Err(e) => panic!(
                "no refresh while {what} succeeded for {:?}: {e}",
                refreshed.elapsed()
            ),
        }
    }
}
