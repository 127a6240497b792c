//! `slow-watcher`: what a watcher that stops reading costs everyone else.
//! Writers run twice for `--phase` each: alone, then with a watch of the
//! written key opened on a member and never read (its HTTP/2 window and
//! the server's buffers fill up). Reports writes/s of both phases and
//! their ratio. What must hold: the stalled watcher, once read again, has
//! every event in order or is told it was dropped (a cancel with a
//! reason); it never silently loses events.

use super::load::{connect_all, joined_series, within, Writers};
use super::{drive, Common, Endpoints, Outcome};
use futures::StreamExt;
use latchkey_shared::client::watches::open_watches;
use std::process::ExitCode;
use std::time::{Duration, Instant};

#[derive(clap::Args, Debug)]
pub struct SlowWatcherArgs {
    #[command(flatten)]
    common: Common,
    /// Concurrent writers.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    writers: u64,
    /// Bytes per value: bigger values fill the stalled watcher's buffers
    /// sooner.
    #[arg(long, default_value_t = 4096, value_parser = clap::value_parser!(u32).range(1..=1_048_576))]
    value_size: u32,
}

pub async fn main(args: SlowWatcherArgs) -> ExitCode {
    let args = &args;
    drive("slow-watcher", &args.common, |endpoints| async move {
        run(args, &endpoints).await
    })
    .await
}

async fn run(args: &SlowWatcherArgs, endpoints: &Endpoints) -> Result<Outcome, String> {
    if endpoints.cells.is_empty() {
        return Err("needs a member's address (--cells) for the stalled watch".into());
    }
    let front = endpoints.require_grpc()?.to_vec();
    let key = format!(
        "loadtest/slow-watcher/{}-{:06x}",
        std::process::id(),
        fastrand::u32(..1 << 24)
    );
    let timeout = args.common.op_timeout;
    let clients = connect_all(&front, args.writers, timeout).await?;
    let value = vec![b'w'; args.value_size as usize];
    // Every writer puts the one watched key.
    let phase = async |label: &str| {
        let keys = vec![key.clone(); clients.len()];
        Writers::run(
            &clients,
            &keys,
            &value,
            timeout,
            label,
            args.common.duration,
        )
        .await
        .0
    };
    let alone = phase("alone").await;

    // A watcher that never reads, on a member.
    let member = &endpoints.cells[0];
    let what = format!("connecting to {member}");
    let channel = within(timeout, &what, latchkey_shared::client::connect(member)).await?;
    let what = format!("opening the stalled watch at {member}");
    let opened = open_watches(channel, key.as_bytes(), 0, 1);
    let (requests, mut answers) = within(timeout, &what, opened).await?;
    let stalled = phase("stalled").await;

    // Read the stalled watcher now: its revisions must run without a gap
    // from its first to the end, unless it was cancelled.
    let mut revisions = Vec::new();
    let mut cancelled: Option<String> = None;
    // What it holds may be a long backlog: the time to read it grows with
    // what was written (a second per 5 000 events on top of 30 s), and it
    // may take a while to answer at all once read again.
    let written = stalled.done();
    let drain_end = Instant::now() + Duration::from_secs(30 + written / 5_000);
    let mut last_seen = Instant::now();
    while Instant::now() < drain_end
        && last_seen.elapsed() < Duration::from_secs(10)
        && (revisions.len() as u64) < written
    {
        match tokio::time::timeout(Duration::from_secs(1), answers.next()).await {
            Ok(Some(Ok(resp))) => {
                last_seen = Instant::now();
                if resp.canceled {
                    cancelled = Some(resp.cancel_reason.clone());
                    break;
                }
                revisions.extend(
                    resp.events
                        .iter()
                        .filter_map(|e| e.kv.as_ref().map(|kv| kv.mod_revision)),
                );
            }
            Ok(Some(Err(status))) => {
                cancelled = Some(format!("the stream failed: {status}"));
                break;
            }
            Ok(None) => {
                cancelled = Some("the stream ended".to_string());
                break;
            }
            Err(_) => {}
        }
    }
    drop(requests);
    // Every write of the key is a revision of its own: the stalled phase's
    // writes are consecutive revisions unless something else wrote between.
    let gaps = revisions.windows(2).filter(|w| w[1] <= w[0]).count() as u64;
    let delivered = revisions.len() as u64;
    // Without a cancel, everything written while it watched must arrive.
    let lost = match cancelled {
        Some(_) => 0,
        None => written.saturating_sub(delivered),
    };

    let ratio = stalled.rate() / alone.rate().max(1e-9);
    let mut o = Outcome::new("slow-watcher", endpoints.target);
    o.field("endpoints", front);
    o.field("writers", args.writers);
    o.field("value_size", args.value_size);
    o.figure(
        "writes_per_s_alone",
        alone.rate(),
        format!("{:.0}", alone.rate()),
    );
    o.figure(
        "writes_per_s_with_stalled_watcher",
        stalled.rate(),
        format!("{:.0}", stalled.rate()),
    );
    o.figure(
        "ratio",
        ratio,
        format!("{ratio:.2} (1.0: the stalled watcher costs nothing)"),
    );
    o.latency("write_alone", &alone.latency());
    o.latency("write_stalled", &stalled.latency());
    o.figure(
        "stalled_watcher",
        cancelled.clone().unwrap_or_else(|| "kept".to_string()),
        match &cancelled {
            Some(why) => format!("dropped and told so: {why} ({delivered} events before)"),
            None => format!("kept: {delivered} of {written} events delivered"),
        },
    );
    o.safety("silently_lost", lost);
    o.safety("out_of_order", gaps);
    o.errors(
        alone.errors() + stalled.errors(),
        alone.first_error().or(stalled.first_error()),
    );
    o.series(joined_series(&[&alone, &stalled]));
    Ok(o)
}
