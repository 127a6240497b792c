//! [`TenantLimits`]: each tenant's request rates and watch quota, enforced
//! at this proxy from its share.
//!
//! A tenant ([`TenantRecord`]) may set `requests_per_second` (all of its
//! requests) and `user_requests_per_second` (each user's), for all proxies
//! together; this proxy enforces rate x `--rate-share`, each as a token
//! bucket whose burst is one second of it. A request is charged to the
//! tenant owning the first key it names (a range's start, a put's key, a
//! txn's first compare or operation, a watch's start, a lock's or
//! election's name); one naming no tenant's key, and calls that name no
//! key (leases, sessions, the Auth and cluster APIs), are not charged.
//! Past a rate the request is refused before it reaches the cell with
//! `rate_limited` (HTTP 429 with Retry-After, gRPC ResourceExhausted);
//! each tenant has its own buckets, so one tenant's load never slows
//! another's requests at this proxy.
//!
//! A tenant's `max_watches` bounds the client watches on its keys open at
//! once through the proxies: this proxy holds ceil(max_watches x share) of
//! them ([`TenantWatch`], given back when the watch ends); past it a watch
//! is refused with `quota_exceeded`.
//!
//! A user's rate uses the user of a token the cell has already accepted
//! (`upstream::accepted_tokens`): a forged token never spends another
//! user's share, and a token's first request is charged to its tenant
//! only.
//!
//! The tenants are read from the cell's `Tenants` service (as the proxy)
//! every [`REFRESH`]; a change reaches each proxy within it. While the
//! cell cannot be asked, the tenants last read stay in force.

use crate::metrics_catalog::{QUOTA_REFUSED, RATE_LIMITED, TENANTS_KNOWN};
use crate::upstream::{Cell, Kind, Route};
use arc_swap::ArcSwap;
use latchkey_shared::auth::limiter::TokenBuckets;
use latchkey_shared::etcd_methods::tenants::LIST;
use latchkey_shared::tenant::TenantRecord;
use latchkey_shared::tenants_pb::{TenantListRequest, TenantListResponse};
use latchkey_shared::ApiError;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// How often the tenants are read from the cell.
pub const REFRESH: Duration = Duration::from_secs(1);

/// How often a failing read is logged.
const WARN_EVERY: Duration = Duration::from_secs(60);

pub struct TenantLimits {
    /// `--rate-share`.
    share: f64,
    tenants: ArcSwap<Vec<TenantRecord>>,
    /// By tenant name, and by tenant name, NUL, user name.
    buckets: TokenBuckets,
    /// Client watches open on each tenant's keys, by tenant name.
    watches: Mutex<HashMap<String, u64>>,
}

/// One client watch on a tenant's keys, counted until it is dropped.
pub struct TenantWatch {
    limits: Arc<TenantLimits>,
    tenant: String,
}

impl Drop for TenantWatch {
    fn drop(&mut self) {
        let mut watches = self.limits.watches();
        if let Some(n) = watches.get_mut(&self.tenant) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                watches.remove(&self.tenant);
            }
        }
    }
}

impl TenantLimits {
    pub fn new(share: f64) -> TenantLimits {
        TenantLimits {
            share,
            tenants: ArcSwap::from_pointee(Vec::new()),
            buckets: TokenBuckets::default(),
            watches: Mutex::default(),
        }
    }

    fn watches(&self) -> std::sync::MutexGuard<'_, HashMap<String, u64>> {
        self.watches.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A place for one more client watch starting at `key`, held until
    /// the [`TenantWatch`] is dropped: `None` when no tenant with a watch
    /// quota owns the key; `quota_exceeded` when this proxy's share of it
    /// is taken.
    pub fn hold_watch(self: &Arc<Self>, key: &[u8]) -> Result<Option<TenantWatch>, ApiError> {
        let tenants = self.tenants.load();
        let Some(tenant) = tenants.iter().find(|t| t.owns(key) && t.max_watches > 0) else {
            return Ok(None);
        };
        let here = ((tenant.max_watches as f64 * self.share).ceil() as u64).max(1);
        let mut watches = self.watches();
        let open = watches.entry(tenant.name.clone()).or_default();
        if *open >= here {
            metrics::counter!(QUOTA_REFUSED.name, "tenant" => tenant.name.clone(), "quota" => "watches")
                .increment(1);
            return Err(ApiError::quota_exceeded(format!(
                "tenant {:?} has {open} watches open at this proxy, its share of max_watches {}; \
                 cancel one or raise the quota",
                tenant.name, tenant.max_watches
            )));
        }
        *open += 1;
        Ok(Some(TenantWatch {
            limits: self.clone(),
            tenant: tenant.name.clone(),
        }))
    }

    /// The tenants as the cell has them now.
    pub fn set(&self, tenants: Vec<TenantRecord>) {
        metrics::gauge!(TENANTS_KNOWN.name).set(tenants.len() as f64);
        self.tenants.store(Arc::new(tenants));
    }

    /// Charges one request naming `key`, by the user `user` says (when
    /// the cell has accepted the token that names it; asked only when the
    /// tenant has a rate per user), at `now`: `rate_limited` past the
    /// owning tenant's rate or its rate per user (a request refused by one
    /// is not charged to the other).
    pub fn charge<U: AsRef<str>>(
        &self,
        key: &[u8],
        user: impl FnOnce() -> Option<U>,
        now: Instant,
    ) -> Result<(), ApiError> {
        let tenants = self.tenants.load();
        let Some(tenant) = tenants.iter().find(|t| t.owns(key)) else {
            return Ok(());
        };
        let user = match tenant.user_requests_per_second {
            0 => None,
            _ => user(),
        };
        let per_user = match (
            user.as_ref().map(AsRef::as_ref),
            tenant.user_requests_per_second,
        ) {
            (Some(user), rate) if rate > 0 => {
                let rate = rate as f64 * self.share;
                let bucket = format!("{}\0{user}", tenant.name);
                self.buckets
                    .take(&bucket, rate, rate, now)
                    .map_err(|wait| {
                        refused(&tenant.name, "user", wait, &format!("by user {user:?} "))
                    })?;
                Some((bucket, rate))
            }
            _ => None,
        };
        if tenant.requests_per_second > 0 {
            let rate = tenant.requests_per_second as f64 * self.share;
            if let Err(wait) = self.buckets.take(&tenant.name, rate, rate, now) {
                if let Some((bucket, rate)) = per_user {
                    self.buckets.give_back(&bucket, rate);
                }
                return Err(refused(&tenant.name, "tenant", wait, ""));
            }
        }
        Ok(())
    }

    /// Reads the tenants from `cell` every [`REFRESH`] until `shutdown`.
    pub async fn keep_current(self: Arc<Self>, cell: Cell, shutdown: CancellationToken) {
        let mut tick = tokio::time::interval(REFRESH);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut warned: Option<Instant> = None;
        while shutdown.run_until_cancelled(tick.tick()).await.is_some() {
            let listed: Result<TenantListResponse, ApiError> = cell
                .call(Route::Any, Kind::Read, LIST, TenantListRequest {})
                .await;
            match listed {
                Ok(list) => self.set(
                    list.tenants
                        .into_iter()
                        .filter_map(|info| info.tenant.map(TenantRecord::from_pb))
                        .collect(),
                ),
                Err(e) => {
                    if warned.is_none_or(|at| at.elapsed() >= WARN_EVERY) {
                        tracing::warn!(error = %e,
                            "cannot read the tenants from the cell; their request rates stay as last read");
                        warned = Some(Instant::now());
                    }
                }
            }
        }
    }
}

fn refused(tenant: &str, scope: &'static str, wait: Duration, by: &str) -> ApiError {
    metrics::counter!(RATE_LIMITED.name, "tenant" => tenant.to_string(), "scope" => scope)
        .increment(1);
    ApiError::rate_limited(&format!("requests {by}for tenant {tenant:?}"), wait)
}

#[cfg(test)]
mod tests {
    use super::*;
    use latchkey_shared::ErrorCode;

    fn tenant(name: &str, prefix: &str, rate: u64, user_rate: u64) -> TenantRecord {
        TenantRecord {
            name: name.into(),
            prefixes: vec![prefix.as_bytes().to_vec()],
            requests_per_second: rate,
            user_requests_per_second: user_rate,
            ..TenantRecord::default()
        }
    }

    #[test]
    fn a_tenant_is_held_to_its_share_and_another_is_not_slowed() {
        let rates = TenantLimits::new(0.5);
        rates.set(vec![
            tenant("acme", "acme/", 8, 0),
            tenant("free", "free/", 0, 0),
        ]);
        let t0 = Instant::now();
        // 8/s with a share of one half: a burst of 4, then 4 a second.
        for _ in 0..4 {
            rates
                .charge(b"acme/k", || None::<&str>, t0)
                .expect("within the burst");
        }
        let e = rates
            .charge(b"acme/k", || None::<&str>, t0)
            .expect_err("past it");
        assert_eq!(e.code, ErrorCode::RateLimited);
        assert_eq!(e.retry_after(), Some(Duration::from_millis(250)));
        assert!(e.message.contains("acme"), "{}", e.message);
        for _ in 0..1000 {
            rates
                .charge(b"free/k", || None::<&str>, t0)
                .expect("no rate");
            rates
                .charge(b"other", || None::<&str>, t0)
                .expect("no tenant");
        }
        let later = t0 + Duration::from_millis(250);
        rates
            .charge(b"acme/k", || None::<&str>, later)
            .expect("one back");
        assert!(rates.charge(b"acme/k", || None::<&str>, later).is_err());
    }

    #[test]
    fn a_tenants_watches_are_held_to_its_share_and_given_back() {
        let limits = Arc::new(TenantLimits::new(0.5));
        let mut acme = tenant("acme", "acme/", 0, 0);
        acme.max_watches = 3;
        limits.set(vec![acme, tenant("free", "free/", 0, 0)]);
        // ceil(3 x 0.5) = 2 here.
        let first = limits.hold_watch(b"acme/a").expect("one").expect("held");
        let _second = limits.hold_watch(b"acme/b").expect("two").expect("held");
        let e = limits.hold_watch(b"acme/c").err().expect("a third");
        assert_eq!(e.code, ErrorCode::QuotaExceeded);
        assert!(e.message.contains("acme"), "{}", e.message);
        assert!(limits.hold_watch(b"free/x").expect("no quota").is_none());
        drop(first);
        limits
            .hold_watch(b"acme/c")
            .expect("given back")
            .expect("held");
    }

    #[test]
    fn each_user_has_its_own_rate_inside_the_tenants() {
        let rates = TenantLimits::new(1.0);
        rates.set(vec![tenant("acme", "acme/", 5, 2)]);
        let t0 = Instant::now();
        for _ in 0..2 {
            rates
                .charge(b"acme/k", || Some("bob"), t0)
                .expect("bob's two");
        }
        let e = rates
            .charge(b"acme/k", || Some("bob"), t0)
            .expect_err("bob's third");
        assert!(e.message.contains("bob"), "{}", e.message);
        // Refused by bob's rate: not charged to the tenant.
        for _ in 0..2 {
            rates
                .charge(b"acme/k", || Some("carol"), t0)
                .expect("carol's two");
        }
        rates
            .charge(b"acme/k", || None::<&str>, t0)
            .expect("the tenant's fifth");
        let e = rates
            .charge(b"acme/k", || Some("dave"), t0)
            .expect_err("tenant's sixth");
        assert!(
            !e.message.contains("dave"),
            "the tenant's rate: {}",
            e.message
        );
        // Refused by the tenant's rate: dave's token is given back.
        let later = t0 + Duration::from_millis(200);
        rates
            .charge(b"acme/k", || Some("dave"), later)
            .expect("dave");
        rates
            .charge(b"acme/k", || Some("dave"), later)
            .expect_err("the tenant's");
    }
}
