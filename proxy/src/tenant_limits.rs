//! [`TenantLimits`]: each tenant's request rates and watch quota, enforced
//! at this proxy from its share.
//!
//! A tenant ([`TenantRecord`]) may set `requests_per_second` (all of its
//! requests) and `user_requests_per_second` (each user's), for all proxies
//! together; this proxy enforces rate x `--rate-share`, each as a token
//! bucket whose burst is one second of it. A request is charged to every
//! tenant whose prefixes overlap a key range it names (a range, a put's or
//! delete's key, every compare and operation of a txn, a watch, a lock's
//! or election's name), once each; if any refuses, none is charged. Calls
//! that name no key (leases, sessions, the Auth and cluster APIs) are not
//! charged. Past a rate the request is refused before it reaches the cell
//! with `rate_limited` (HTTP 429 with Retry-After, gRPC
//! ResourceExhausted); each tenant has its own buckets, so one tenant's
//! load never slows another's requests at this proxy.
//!
//! A tenant's `max_watches` bounds the client watches on its keys open at
//! once through the proxies: this proxy holds ceil(max_watches x share) of
//! them ([`TenantWatch`], given back when the watch ends); past it a watch
//! is refused with `quota_exceeded`.
//!
//! Who sends a request ([`Requester`], found by `ops::rates`) decides
//! which buckets it takes from. With authentication on, a request whose
//! token the cell has vouched for (`upstream::accepted_tokens`) is charged
//! to its tenant's bucket and to its user's; one whose token the cell
//! refused, or that the proxy could not ask about in time, to a bucket of
//! the tenant's own for unverified requests, at the tenant's rate:
//! requests the cell will refuse never spend the share of the tenant's
//! real users, and a forged token never spends another user's. With
//! authentication off, the tenant's bucket alone.
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
use latchkey_shared::{ApiError, KeyRange};
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

/// One client watch's places in its tenants' watch quotas, held until it
/// is dropped.
pub struct TenantWatch {
    limits: Arc<TenantLimits>,
    tenants: Vec<String>,
}

impl Drop for TenantWatch {
    fn drop(&mut self) {
        self.limits.release_watches(&self.tenants);
    }
}

/// Who sends a request, as the proxy knows it.
pub enum Requester<U> {
    /// Authentication is off.
    Anyone,
    /// A user the cell has accepted a token of.
    User(U),
    /// Authentication is on and the token is none the cell has accepted.
    Unverified,
}

/// The tenants with a rate a request touches, as of one reading of them.
pub struct Rated {
    tenants: Arc<Vec<TenantRecord>>,
    owners: Vec<usize>,
}

/// Whether any of `tenant`'s prefixes overlaps any of `ranges`.
fn touches(tenant: &TenantRecord, ranges: &[KeyRange]) -> bool {
    tenant
        .prefixes
        .iter()
        .any(|p| ranges.iter().any(|r| KeyRange::prefix(p).overlaps(r)))
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

    /// Whether any tenant exists (else nothing is charged or counted).
    pub fn any(&self) -> bool {
        !self.tenants.load().is_empty()
    }

    /// The tenants with a request rate that own a key in `ranges`, if
    /// any: what [`charge_rated`](Self::charge_rated) charges.
    pub fn rated(&self, ranges: &[KeyRange]) -> Option<Rated> {
        let tenants = self.tenants.load_full();
        let owners: Vec<usize> = (0..tenants.len())
            .filter(|&i| {
                let t = &tenants[i];
                (t.requests_per_second > 0 || t.user_requests_per_second > 0) && touches(t, ranges)
            })
            .collect();
        (!owners.is_empty()).then_some(Rated { tenants, owners })
    }

    /// The tenants as the cell has them now.
    pub fn set(&self, tenants: Vec<TenantRecord>) {
        metrics::gauge!(TENANTS_KNOWN.name).set(tenants.len() as f64);
        self.tenants.store(Arc::new(tenants));
    }

    fn watches(&self) -> std::sync::MutexGuard<'_, HashMap<String, u64>> {
        self.watches.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn release_watches(&self, tenants: &[String]) {
        let mut watches = self.watches();
        for tenant in tenants {
            if let Some(n) = watches.get_mut(tenant) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    watches.remove(tenant);
                }
            }
        }
    }

    /// This proxy's share of `per_second`, and of one second's burst.
    fn here(&self, per_second: u64) -> f64 {
        per_second as f64 * self.share
    }

    /// Places for one more client watch on `range`, one in the quota of
    /// every tenant it overlaps that has one, held until the
    /// [`TenantWatch`] is dropped; `quota_exceeded` (holding none) when
    /// this proxy's share of one of them is taken.
    pub fn hold_watch(self: &Arc<Self>, range: &KeyRange) -> Result<TenantWatch, ApiError> {
        let tenants = self.tenants.load();
        let mut held = TenantWatch {
            limits: self.clone(),
            tenants: Vec::new(),
        };
        let quoted = tenants
            .iter()
            .filter(|t| t.max_watches > 0 && touches(t, std::slice::from_ref(range)));
        for tenant in quoted {
            let here = ((tenant.max_watches as f64 * self.share).ceil() as u64).max(1);
            let mut watches = self.watches();
            let open = watches.entry(tenant.name.clone()).or_default();
            if *open >= here {
                let open = *open;
                drop(watches);
                metrics::counter!(QUOTA_REFUSED.name, "tenant" => tenant.name.clone(), "quota" => "watches")
                    .increment(1);
                // `held` gives back what it took when it drops here.
                return Err(ApiError::quota_exceeded(format!(
                    "tenant {:?} has {open} watches open at this proxy, its share of max_watches {}; \
                     cancel one or raise the quota",
                    tenant.name, tenant.max_watches
                )));
            }
            *open += 1;
            held.tenants.push(tenant.name.clone());
        }
        Ok(held)
    }

    /// Charges one request naming `ranges`, from `requester`, to every
    /// tenant they overlap at `now`: `rate_limited` past any of those
    /// rates, and then nothing is charged.
    pub fn charge<U: AsRef<str>>(
        &self,
        ranges: &[KeyRange],
        requester: Requester<U>,
        now: Instant,
    ) -> Result<(), ApiError> {
        match self.rated(ranges) {
            Some(rated) => self.charge_rated(&rated, requester, now),
            None => Ok(()),
        }
    }

    /// [`charge`](Self::charge) for the tenants `rated` found.
    pub fn charge_rated<U: AsRef<str>>(
        &self,
        rated: &Rated,
        requester: Requester<U>,
        now: Instant,
    ) -> Result<(), ApiError> {
        let owners = rated.owners.iter().map(|&i| &rated.tenants[i]);
        let (user, unverified) = match &requester {
            Requester::Anyone => (None, false),
            Requester::User(user) => (Some(user.as_ref()), false),
            Requester::Unverified => (None, true),
        };
        // Every bucket this request takes from, and what refuses it.
        let mut wanted: Vec<(String, f64, Refusal)> = Vec::new();
        for tenant in owners {
            if let (Some(user), rate @ 1..) = (user, tenant.user_requests_per_second) {
                wanted.push((
                    format!("{}\0{user}", tenant.name),
                    self.here(rate),
                    Refusal::User(tenant.name.clone(), user.to_string()),
                ));
            }
            if tenant.requests_per_second > 0 {
                // NUL never ends a user name's bucket key: this one is apart.
                let bucket = match unverified {
                    false => tenant.name.clone(),
                    true => format!("{}\0", tenant.name),
                };
                wanted.push((
                    bucket,
                    self.here(tenant.requests_per_second),
                    Refusal::Tenant(tenant.name.clone()),
                ));
            }
        }
        for (i, (bucket, rate, refusal)) in wanted.iter().enumerate() {
            if let Err(wait) = self.buckets.take(bucket, *rate, *rate, now) {
                for (taken, rate, _) in &wanted[..i] {
                    self.buckets.give_back(taken, *rate);
                }
                return Err(refusal.error(wait));
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

/// Which rate refused a request.
enum Refusal {
    Tenant(String),
    User(String, String),
}

impl Refusal {
    fn error(&self, wait: Duration) -> ApiError {
        let (tenant, scope, by) = match self {
            Refusal::Tenant(t) => (t, "tenant", String::new()),
            Refusal::User(t, u) => (t, "user", format!("by user {u:?} ")),
        };
        metrics::counter!(RATE_LIMITED.name, "tenant" => tenant.clone(), "scope" => scope)
            .increment(1);
        ApiError::rate_limited(&format!("requests {by}for tenant {tenant:?}"), wait)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use latchkey_shared::ErrorCode;

    fn k(key: &[u8]) -> [KeyRange; 1] {
        [KeyRange::single(key.to_vec())]
    }

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
                .charge(&k(b"acme/k"), Requester::<&str>::Anyone, t0)
                .expect("within the burst");
        }
        let e = rates
            .charge(&k(b"acme/k"), Requester::<&str>::Anyone, t0)
            .expect_err("past it");
        assert_eq!(e.code, ErrorCode::RateLimited);
        assert_eq!(e.retry_after(), Some(Duration::from_millis(250)));
        assert!(e.message.contains("acme"), "{}", e.message);
        for _ in 0..1000 {
            rates
                .charge(&k(b"free/k"), Requester::<&str>::Anyone, t0)
                .expect("no rate");
            rates
                .charge(&k(b"other"), Requester::<&str>::Anyone, t0)
                .expect("no tenant");
        }
        let later = t0 + Duration::from_millis(250);
        rates
            .charge(&k(b"acme/k"), Requester::<&str>::Anyone, later)
            .expect("one back");
        assert!(rates
            .charge(&k(b"acme/k"), Requester::<&str>::Anyone, later)
            .is_err());
    }

    #[test]
    fn a_tenants_watches_are_held_to_its_share_and_given_back() {
        let limits = Arc::new(TenantLimits::new(0.5));
        let mut acme = tenant("acme", "acme/", 0, 0);
        acme.max_watches = 3;
        limits.set(vec![acme, tenant("free", "free/", 0, 0)]);
        // ceil(3 x 0.5) = 2 here.
        let first = limits.hold_watch(&k(b"acme/a")[0]).expect("one");
        let _second = limits.hold_watch(&k(b"acme/b")[0]).expect("two");
        let e = limits.hold_watch(&k(b"acme/c")[0]).err().expect("a third");
        assert_eq!(e.code, ErrorCode::QuotaExceeded);
        assert!(e.message.contains("acme"), "{}", e.message);
        assert!(limits
            .hold_watch(&k(b"free/x")[0])
            .expect("no quota")
            .tenants
            .is_empty());
        drop(first);
        let _third = limits.hold_watch(&k(b"acme/c")[0]).expect("given back");
        // A watch over every key is in acme's quota too.
        let everything = KeyRange::prefix(b"");
        assert!(limits.hold_watch(&everything).is_err());
    }

    #[test]
    fn unverified_requests_never_spend_the_share_of_verified_ones() {
        let rates = TenantLimits::new(1.0);
        rates.set(vec![tenant("acme", "acme/", 2, 0)]);
        let t0 = Instant::now();
        for _ in 0..2 {
            rates
                .charge(&k(b"acme/k"), Requester::<&str>::Unverified, t0)
                .expect("the unverified bucket's two");
        }
        assert!(rates
            .charge(&k(b"acme/k"), Requester::<&str>::Unverified, t0)
            .is_err());
        for _ in 0..2 {
            rates
                .charge(&k(b"acme/k"), Requester::User("bob"), t0)
                .expect("a verified user's requests are apart");
        }
    }

    #[test]
    fn a_range_over_two_tenants_is_charged_to_both_or_neither() {
        let rates = TenantLimits::new(1.0);
        rates.set(vec![tenant("a", "a/", 1, 0), tenant("b", "b/", 2, 0)]);
        let t0 = Instant::now();
        let both = [KeyRange::new(b"a".to_vec(), b"c".to_vec())];
        rates
            .charge(&both, Requester::<&str>::Anyone, t0)
            .expect("one of each");
        // a's bucket is empty: refused, and b is not charged for it.
        let e = rates
            .charge(&both, Requester::<&str>::Anyone, t0)
            .expect_err("a's");
        assert!(e.message.contains("\"a\""), "{}", e.message);
        rates
            .charge(&k(b"b/1"), Requester::<&str>::Anyone, t0)
            .expect("b's second");
        assert!(rates
            .charge(&k(b"b/1"), Requester::<&str>::Anyone, t0)
            .is_err());
        // Every key, from the start: both.
        let later = t0 + Duration::from_secs(1);
        let all = [KeyRange::prefix(b"")];
        rates
            .charge(&all, Requester::<&str>::Anyone, later)
            .expect("refilled");
        assert!(rates
            .charge(&k(b"a/1"), Requester::<&str>::Anyone, later)
            .is_err());
    }

    #[test]
    fn each_user_has_its_own_rate_inside_the_tenants() {
        let rates = TenantLimits::new(1.0);
        rates.set(vec![tenant("acme", "acme/", 5, 2)]);
        let t0 = Instant::now();
        for _ in 0..2 {
            rates
                .charge(&k(b"acme/k"), Requester::User("bob"), t0)
                .expect("bob's two");
        }
        let e = rates
            .charge(&k(b"acme/k"), Requester::User("bob"), t0)
            .expect_err("bob's third");
        assert!(e.message.contains("bob"), "{}", e.message);
        // Refused by bob's rate: not charged to the tenant.
        for _ in 0..2 {
            rates
                .charge(&k(b"acme/k"), Requester::User("carol"), t0)
                .expect("carol's two");
        }
        rates
            .charge(&k(b"acme/k"), Requester::<&str>::Anyone, t0)
            .expect("the tenant's fifth");
        let e = rates
            .charge(&k(b"acme/k"), Requester::User("dave"), t0)
            .expect_err("tenant's sixth");
        assert!(
            !e.message.contains("dave"),
            "the tenant's rate: {}",
            e.message
        );
        // Refused by the tenant's rate: dave's token is given back.
        let later = t0 + Duration::from_millis(200);
        rates
            .charge(&k(b"acme/k"), Requester::User("dave"), later)
            .expect("dave");
        rates
            .charge(&k(b"acme/k"), Requester::User("dave"), later)
            .expect_err("the tenant's");
    }
}
