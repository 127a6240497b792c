//! `mass-expiry`: what many leases expiring together cost the writes that
//! run meanwhile. Writers run for `--duration` alone (the baseline); then
//! `--leases` leases, each with a key, are refreshed in one round so they
//! all expire together `--ttl` later, and the writers run again across
//! that moment. Reports write p99 of both phases and of the second around
//! the expiry. What must hold: once the TTL and a grace have passed, no
//! lease and none of their keys is left.

use super::load::{connect_all, joined_series, own_keys, within, Writers};
use super::recorder::{counter, Latency};
use super::{drive, Common, Endpoints, Outcome};
use futures::StreamExt;
use latchkey_shared::client::KeepAliveStream;
use std::process::ExitCode;
use std::time::{Duration, Instant};

#[derive(clap::Args, Debug)]
pub struct MassExpiryArgs {
    #[command(flatten)]
    common: Common,
    /// Leases that expire together, each with one key.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    leases: u64,
    /// Their TTL in seconds, counted from one refresh of them all.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(i64).range(2..=600))]
    ttl: i64,
    /// Concurrent writers.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    writers: u64,
    /// How long after the TTL the leases and keys must be gone.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    grace: Duration,
}

pub async fn main(args: MassExpiryArgs) -> ExitCode {
    let args = &args;
    drive("mass-expiry", &args.common, |endpoints| async move {
        run(args, &endpoints).await
    })
    .await
}

/// How many of `leases` still exist (TimeToLive answers TTL -1 for one
/// that does not).
async fn alive(
    clients: &[etcd_client::Client],
    leases: &[i64],
    timeout: Duration,
) -> Result<usize, String> {
    let answers: Vec<Result<bool, String>> = futures::stream::iter(leases.iter().enumerate())
        .map(|(i, id)| {
            let mut c = clients[i % clients.len()].clone();
            async move {
                let asked = within(
                    timeout,
                    "asking a lease's TTL",
                    c.lease_time_to_live(*id, None),
                )
                .await?;
                Ok(asked.ttl() >= 0)
            }
        })
        .buffer_unordered(128)
        .collect()
        .await;
    let mut n = 0;
    for a in answers {
        n += usize::from(a?);
    }
    Ok(n)
}

async fn run(args: &MassExpiryArgs, endpoints: &Endpoints) -> Result<Outcome, String> {
    let timeout = args.common.op_timeout;
    let front = endpoints.require_grpc()?.to_vec();
    let clients = connect_all(&front, args.writers, timeout, None).await?;
    let keys = own_keys("loadtest/mass-expiry/writer/", clients.len());
    let value = b"v".to_vec();
    let (baseline, _) = Writers::run(
        &clients,
        &keys,
        &value,
        timeout,
        "baseline",
        args.common.duration,
    )
    .await;

    // The leases, each with a key; one keep-alive round then sets every
    // deadline to the same moment (a keep-alive restores the granted TTL).
    let prefix = format!(
        "loadtest/mass-expiry/{}-{:06x}/",
        std::process::id(),
        fastrand::u32(..1 << 24)
    );
    let creating = Instant::now();
    let bar = counter("leases", args.leases);
    let granted: Vec<Result<i64, String>> = futures::stream::iter(0..args.leases)
        .map(|i| {
            let mut c = clients[i as usize % clients.len()].clone();
            let (key, bar) = (format!("{prefix}{i:08}"), bar.clone());
            async move {
                let made = async {
                    let lease = c.lease_grant(args.ttl, None).await?.id();
                    let put = etcd_client::PutOptions::new().with_lease(lease);
                    c.put(key, "x", Some(put)).await?;
                    Ok::<i64, etcd_client::Error>(lease)
                };
                let made = within(timeout, "a lease with a key", made).await;
                bar.inc(1);
                made
            }
        })
        .buffer_unordered(128)
        .collect()
        .await;
    bar.finish_and_clear();
    let leases: Vec<i64> = granted.into_iter().collect::<Result<_, _>>()?;
    let ttl = Duration::from_secs(args.ttl as u64);
    if creating.elapsed() + Duration::from_secs(1) >= ttl {
        return Err(format!(
            "creating {} leases took {:.1} s, longer than their TTL: the first would expire \
             before the rest; use a larger --ttl or fewer --leases",
            args.leases,
            creating.elapsed().as_secs_f64()
        ));
    }
    let member = front[0].clone();
    let round_started = Instant::now();
    let mut stream = KeepAliveStream::open(&member)
        .await
        .map_err(|e| format!("a keep-alive stream at {member}: {e}"))?;
    stream
        .refresh(&leases, ttl)
        .await
        .map_err(|e| format!("refreshing the leases together: {e}"))?;
    drop(stream);
    let refreshed = Instant::now();
    // The round refreshed leases from its start to its end: they expire
    // over that span, TTL later.
    let expiry = refreshed + ttl;
    let first_expiry = round_started + ttl;

    let length = ttl + Duration::from_secs(5);
    let (during, acks) = Writers::run(&clients, &keys, &value, timeout, "expiring", length).await;
    let around = Latency::of_micros(
        acks.iter()
            .filter(|(at, _)| {
                *at + Duration::from_millis(500) >= first_expiry
                    && *at <= expiry + Duration::from_secs(3)
            })
            .map(|(_, took)| took.as_micros() as u64),
    );

    // Every lease and its key must be gone once the grace has passed:
    // asked with TimeToLive, which (unlike a keep-alive) extends nothing.
    let check_at = expiry + args.grace;
    let leases_left = loop {
        let left = alive(&clients, &leases, timeout).await?;
        if left == 0 || Instant::now() >= check_at {
            break left;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let mut reader = clients[0].clone();
    let count_only = etcd_client::GetOptions::new()
        .with_prefix()
        .with_count_only();
    let counted = reader.get(prefix.as_str(), Some(count_only));
    let keys_left = within(timeout, "counting the keys left", counted)
        .await?
        .count() as u64;
    let gone_after = refreshed.elapsed().as_secs_f64();

    let mut o = Outcome::new("mass-expiry", endpoints.target);
    o.field("endpoints", front);
    o.field("writers", args.writers);
    o.figure(
        "leases",
        args.leases,
        format!(
            "{} with a key each, TTL {} s, expiring together",
            args.leases, args.ttl
        ),
    );
    o.figure(
        "writes_per_s_baseline",
        baseline.rate(),
        format!("{:.0}", baseline.rate()),
    );
    o.figure(
        "writes_per_s_expiring",
        during.rate(),
        format!("{:.0}", during.rate()),
    );
    o.latency("write_baseline", &baseline.latency());
    o.latency("write_expiring", &during.latency());
    o.latency("write_around_expiry", &around);
    o.safety("leases_left", leases_left as u64);
    o.safety("keys_left", keys_left);
    o.field("checked_after_s", gone_after);
    o.errors(
        baseline.errors() + during.errors(),
        baseline.first_error().or(during.first_error()),
    );
    o.series(joined_series(&[&baseline, &during]));
    Ok(o)
}
