//! `slow-watcher`: what a watcher that stops reading costs everyone else.
//! Writers put one key in `--rounds` pairs of slices within `--duration`:
//! alone, then with a watch of the key opened on a member and never read
//! (its HTTP/2 window and the server's buffers fill up). Reports writes/s
//! of both kinds of slice and their ratio. What must hold: the stalled watcher, once read again, has
//! every event in order or is told it was dropped (a cancel with a
//! reason); it never silently loses events.

use super::load::{connect_all, joined_series, within, Ack, Writers};
use super::recorder::{Latency, Recorder};
use super::{drive, Common, Endpoints, Outcome};
use futures::StreamExt;
use latchkey_shared::client::watches::open_watches;
use std::process::ExitCode;
use std::sync::Arc;
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
    /// Alone and stalled slices alternate this many times within
    /// `--duration` (a new stalled watcher each time, read and closed at
    /// the end of its slice).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..=100))]
    rounds: u64,
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
    let clients = connect_all(&front, args.writers, timeout, None).await?;
    let value = vec![b'w'; args.value_size as usize];
    let slice = args.common.duration / (2 * args.rounds as u32);
    // Every writer puts the one watched key.
    let phase = async |label: &str| {
        let keys = vec![key.clone(); clients.len()];
        Writers::run(&clients, &keys, &value, timeout, label, slice).await
    };
    // Alone and stalled alternate, so what the cell does now and then (a
    // snapshot, a compaction: whole seconds on a busy 2-core machine) falls
    // into both kinds of slice alike instead of into one phase.
    let (mut alone, mut stalled) = (Vec::new(), Vec::new());
    let mut watched = Watched::default();
    for round in 1..=args.rounds {
        alone.push(phase(&format!("alone {round}/{}", args.rounds)).await);

        // A watcher that never reads, on a member, for one slice.
        let member = &endpoints.cells[0];
        let what = format!("connecting to {member}");
        let channel = within(timeout, &what, latchkey_shared::client::connect(member)).await?;
        let what = format!("opening the stalled watch at {member}");
        let opened = open_watches(channel, key.as_bytes(), 0, 1);
        let (requests, answers) = within(timeout, &what, opened).await?;
        let slice = phase(&format!("stalled {round}/{}", args.rounds)).await;
        watched.read(answers, slice.0.done()).await;
        drop(requests);
        stalled.push(slice);
    }

    let rate = |slices: &[(Arc<Recorder>, Vec<Ack>)]| {
        let done: u64 = slices.iter().map(|s| s.0.done()).sum();
        let secs: f64 = slices.iter().map(|s| s.0.elapsed().as_secs_f64()).sum();
        done as f64 / secs.max(1e-9)
    };
    let latency = |slices: &[(Arc<Recorder>, Vec<Ack>)]| {
        Latency::of_micros(
            slices
                .iter()
                .flat_map(|s| s.1.iter().map(|(_, took)| took.as_micros() as u64)),
        )
    };
    let (alone_rate, stalled_rate) = (rate(&alone), rate(&stalled));
    let ratio = stalled_rate / alone_rate.max(1e-9);
    let mut o = Outcome::new("slow-watcher", endpoints.target);
    o.field("endpoints", front);
    o.field("writers", args.writers);
    o.field("value_size", args.value_size);
    o.field("rounds", args.rounds);
    o.figure("writes_per_s_alone", alone_rate, format!("{alone_rate:.0}"));
    o.figure(
        "writes_per_s_with_stalled_watcher",
        stalled_rate,
        format!("{stalled_rate:.0}"),
    );
    o.figure(
        "ratio",
        ratio,
        format!("{ratio:.2} (1.0: the stalled watcher costs nothing)"),
    );
    o.latency("write_alone", &latency(&alone));
    o.latency("write_stalled", &latency(&stalled));
    o.figure(
        "stalled_watchers",
        watched.cancelled.len(),
        format!(
            "{} of {} dropped and told so{}; {} of {} events delivered to the kept ones",
            watched.cancelled.len(),
            args.rounds,
            watched
                .cancelled
                .first()
                .map_or(String::new(), |why| format!(" ({why})")),
            watched.delivered,
            watched.written,
        ),
    );
    o.safety("silently_lost", watched.lost);
    o.safety("out_of_order", watched.gaps);
    let all: Vec<&(Arc<Recorder>, Vec<Ack>)> = alone.iter().chain(&stalled).collect();
    o.errors(
        all.iter().map(|s| s.0.errors()).sum(),
        all.iter().find_map(|s| s.0.first_error()),
    );
    let mut in_order: Vec<&Recorder> = Vec::new();
    for (a, s) in alone.iter().zip(&stalled) {
        in_order.push(&a.0);
        in_order.push(&s.0);
    }
    o.series(joined_series(&in_order));
    Ok(o)
}

/// What the stalled watchers held once read again.
#[derive(Default)]
struct Watched {
    /// Writes made while one was stalled, and events delivered to those
    /// not cancelled.
    written: u64,
    delivered: u64,
    /// Writes a kept watcher never got, and revisions out of order.
    lost: u64,
    gaps: u64,
    /// Why each dropped one was dropped.
    cancelled: Vec<String>,
}

impl Watched {
    /// Reads a stalled watcher, under which `written` writes were made:
    /// its revisions must run without a gap from its first to the end,
    /// unless it was cancelled (and told why).
    async fn read(
        &mut self,
        mut answers: tonic::Streaming<latchkey_shared::etcdpb::PbWatchResponse>,
        written: u64,
    ) {
        let mut revisions = Vec::new();
        let mut cancelled: Option<String> = None;
        // What it holds may be a long backlog: the time to read it grows
        // with what was written (a second per 5 000 events on top of 30 s),
        // and it may take a while to answer at all once read again.
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
        // Every write of the key is a revision of its own: the slice's
        // writes are consecutive revisions unless something else wrote
        // between.
        self.gaps += revisions.windows(2).filter(|w| w[1] <= w[0]).count() as u64;
        self.written += written;
        match cancelled {
            Some(why) => self.cancelled.push(why),
            // Without a cancel, everything written while it watched must
            // arrive.
            None => {
                self.delivered += revisions.len() as u64;
                self.lost += written.saturating_sub(revisions.len() as u64);
            }
        }
    }
}
