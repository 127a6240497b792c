//! Lease keepers: clients that keep one lease alive through one member,
//! or through the proxy (whose session table answers keep-alives from the
//! cell's confirmations of its batched refreshes), and read the lease's
//! key through a member, recording every confirmed keep-alive and every
//! read. A keep-alive confirmed with TTL t promises that the lease lives
//! at least t from the moment it was sent; a read that finds the key gone
//! before that promise ran out is a lease that expired while keep-alives
//! were being confirmed (etcd's field failure, the cell review's defect
//! S1, and for the proxy's table the proxy review's P8).

use super::workload::client_options;
use etcd_client::{Client, PutOptions};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The keepers' lease TTL in seconds (the cell runs with --min-ttl 1).
pub const TTL_SECS: i64 = 1;
const EVERY: Duration = Duration::from_millis(200);
const CALL_TIMEOUT: Duration = Duration::from_secs(2);
/// Millisecond rounding of deadlines and timer granularity.
const SLACK_US: u64 = 50_000;

/// What a keeper saw, on the recorder's clock (µs).
#[derive(Debug, Clone, Copy)]
pub enum Seen {
    /// A keep-alive of lease generation `lease` confirmed with `ttl`
    /// seconds.
    Confirmed {
        lease: i64,
        ttl: i64,
        invoke: u64,
        complete: u64,
        /// Answered by the proxy's session table.
        via_proxy: bool,
    },
    /// A linearizable read of the key of lease `lease`.
    Read {
        lease: i64,
        invoke: u64,
        complete: u64,
        present: bool,
    },
}

pub struct Keeper {
    /// The member, or proxy, keep-alives go to.
    pub keep: String,
    pub via_proxy: bool,
    /// The member reads go to.
    pub read: String,
    /// The key bound to the lease (in a cell that owns it).
    pub key: String,
}

impl Keeper {
    pub async fn run(self, start: Instant, log: Arc<Mutex<Vec<Seen>>>, stop: Arc<AtomicBool>) {
        let now = || start.elapsed().as_micros() as u64;
        let record = |s: Seen| log.lock().unwrap_or_else(|p| p.into_inner()).push(s);
        let key = self.key.as_str();
        while !stop.load(Ordering::Relaxed) {
            let (Ok(mut keep), Ok(mut read)) = (
                Client::connect([self.keep.as_str()], Some(client_options(CALL_TIMEOUT))).await,
                Client::connect([self.read.as_str()], Some(client_options(CALL_TIMEOUT))).await,
            ) else {
                tokio::time::sleep(EVERY).await;
                continue;
            };
            // A new lease and its key; anything failing starts over.
            let Ok(grant) = keep.lease_grant(TTL_SECS, None).await else {
                tokio::time::sleep(EVERY).await;
                continue;
            };
            let lease = grant.id();
            let put = keep
                .put(
                    key,
                    lease.to_string(),
                    Some(PutOptions::new().with_lease(lease)),
                )
                .await;
            if put.is_err() {
                continue;
            }
            // Opening the stream is bounded like every other call here.
            let Ok(Ok((mut keeper, mut stream))) =
                tokio::time::timeout(CALL_TIMEOUT, keep.lease_keep_alive(lease)).await
            else {
                continue;
            };
            while !stop.load(Ordering::Relaxed) {
                let invoke = now();
                let answer = tokio::time::timeout(CALL_TIMEOUT, async {
                    keeper.keep_alive().await?;
                    stream.message().await
                })
                .await;
                match answer {
                    Ok(Ok(Some(r))) if r.ttl() > 0 => record(Seen::Confirmed {
                        lease,
                        ttl: r.ttl(),
                        invoke,
                        complete: now(),
                        via_proxy: self.via_proxy,
                    }),
                    // Gone (TTL 0): a new lease.
                    Ok(Ok(Some(_))) => break,
                    // The stream broke or timed out: open another.
                    _ => match tokio::time::timeout(CALL_TIMEOUT, keep.lease_keep_alive(lease))
                        .await
                    {
                        Ok(Ok((k, s))) => (keeper, stream) = (k, s),
                        _ => break,
                    },
                }
                let invoke = now();
                if let Ok(Ok(got)) = tokio::time::timeout(CALL_TIMEOUT, read.get(key, None)).await {
                    let present = got.kvs().first().is_some_and(|kv| kv.lease() == lease);
                    record(Seen::Read {
                        lease,
                        invoke,
                        complete: now(),
                        present,
                    });
                    if !present {
                        break;
                    }
                }
                tokio::time::sleep(EVERY).await;
            }
        }
    }
}

/// Reads that found a lease's key gone while a confirmed keep-alive still
/// promised the lease was alive: a keep-alive confirmed with TTL `ttl`
/// (sent at `t`, answered before the read was sent) promises the lease
/// until `t + ttl`, so a read answered before then must see the key.
pub fn expired_while_confirmed(seen: &[Seen]) -> Vec<String> {
    let mut violations = Vec::new();
    for s in seen {
        let Seen::Read {
            lease,
            invoke: r_invoke,
            complete: r_complete,
            present: false,
        } = *s
        else {
            continue;
        };
        let promise = seen
            .iter()
            .filter_map(|k| match *k {
                Seen::Confirmed {
                    lease: l,
                    ttl,
                    invoke,
                    complete,
                    ..
                } if l == lease && complete <= r_invoke => {
                    Some((invoke + ttl.max(0) as u64 * 1_000_000, invoke, ttl))
                }
                _ => None,
            })
            .max();
        if let Some((until, sent, ttl)) = promise {
            if r_complete + SLACK_US < until {
                violations.push(format!(
                    "lease {lease:x} was gone at {:.3}s though a keep-alive sent at {:.3}s was \
                     confirmed with TTL {ttl}s (alive until {:.3}s)",
                    r_complete as f64 / 1e6,
                    sent as f64 / 1e6,
                    until as f64 / 1e6
                ));
            }
        }
    }
    violations
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_gone_before_a_confirmed_keep_alive_ran_out_is_a_violation() {
        let s = 1_000_000;
        let ttl = TTL_SECS as u64 * s;
        let confirmed = Seen::Confirmed {
            lease: 7,
            ttl: TTL_SECS,
            invoke: 10 * s,
            complete: 10 * s + 5_000,
            via_proxy: false,
        };
        let gone_early = Seen::Read {
            lease: 7,
            invoke: 10 * s + ttl / 2,
            complete: 10 * s + ttl / 2 + 5_000,
            present: false,
        };
        let gone_after = Seen::Read {
            lease: 7,
            invoke: 10 * s + ttl + 100_000,
            complete: 10 * s + ttl + 110_000,
            present: false,
        };
        let other_lease = Seen::Read {
            lease: 8,
            invoke: 10 * s + ttl / 2,
            complete: 10 * s + ttl / 2 + 5_000,
            present: false,
        };
        assert_eq!(expired_while_confirmed(&[confirmed, gone_early]).len(), 1);
        assert!(expired_while_confirmed(&[confirmed, gone_after]).is_empty());
        assert!(expired_while_confirmed(&[confirmed, other_lease]).is_empty());
    }
}
