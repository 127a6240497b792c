//! Measures the CPU a server spends keeping many leases alive.
//!
//! Grants `--leases` leases on the server at `--endpoint`, then refreshes
//! every one of them each `--interval-secs` for `--duration-secs`, and
//! reports the CPU time the server process `--pid` used meanwhile (from
//! /proc/PID/stat, after one warm-up interval).
//!
//! - `--mode latchkey`: one batched request per interval on latchkey's
//!   session extension (how latchkey-proxy refreshes).
//! - `--mode etcd`: etcd's own protocol as its Go client uses it: one
//!   LeaseKeepAlive stream, one request per lease per interval.
//!
//! scripts/lease-cpu.sh runs both against a latchkey cell and an etcd
//! server on this machine.

use clap::Parser;
use futures::StreamExt;
use latchkey_shared::etcdpb::{PbLeaseKeepAliveRequest, PbLeaseKeepAliveResponse};
use latchkey_shared::sessions_pb::sessions_client::SessionsClient;
use latchkey_shared::sessions_pb::RefreshRequest;
use std::time::{Duration, Instant};
use tonic::codegen::http::uri::PathAndQuery;

#[derive(Parser)]
struct Args {
    #[arg(long)]
    endpoint: String,
    #[arg(long)]
    mode: String,
    #[arg(long, default_value_t = 100_000)]
    leases: usize,
    #[arg(long, default_value_t = 10)]
    interval_secs: u64,
    #[arg(long, default_value_t = 60)]
    duration_secs: u64,
    /// The server process to measure.
    #[arg(long)]
    pid: u32,
}

/// utime + stime of `pid`, in clock ticks.
fn cpu_ticks(pid: u32) -> anyhow::Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the parenthesised command name; utime and stime are the
    // 14th and 15th fields of the whole line.
    let rest = stat
        .rsplit_once(')')
        .map(|(_, r)| r)
        .ok_or_else(|| anyhow::anyhow!("odd /proc stat"))?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    Ok(fields[11].parse::<u64>()? + fields[12].parse::<u64>()?)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let url = format!("http://{}", args.endpoint);
    let client = etcd_client::Client::connect([url.as_str()], None).await?;
    let started = Instant::now();
    // Long enough to outlast granting them all (tens of seconds for
    // 100 000 on a debug build); the refresh cost does not depend on it.
    let ttl = 300;
    let leases: Vec<i64> = futures::stream::iter(0..args.leases)
        .map(|_| {
            let mut c = client.clone();
            async move { c.lease_grant(ttl, None).await.map(|r| r.id()) }
        })
        .buffer_unordered(256)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<_, _>>()?;
    println!(
        "granted {} leases (TTL {ttl} s) in {:?}",
        leases.len(),
        started.elapsed()
    );

    let channel = tonic::transport::Endpoint::from_shared(url.clone())?
        .connect()
        .await?;
    let interval = Duration::from_secs(args.interval_secs);
    let end = Instant::now() + Duration::from_secs(args.duration_secs);
    let mut measuring_from: Option<(Instant, u64)> = None;
    let mut rounds = 0u64;
    match args.mode.as_str() {
        "latchkey" => {
            let (tx, rx) = tokio::sync::mpsc::channel(2);
            let mut responses = SessionsClient::new(channel)
                .max_decoding_message_size(64 << 20)
                .max_encoding_message_size(64 << 20)
                .refresh(tokio_stream::wrappers::ReceiverStream::new(rx))
                .await?
                .into_inner();
            while Instant::now() < end {
                let t = Instant::now();
                rounds += 1;
                tx.send(RefreshRequest {
                    batch: rounds,
                    ids: leases.clone(),
                })
                .await?;
                let resp = responses
                    .message()
                    .await?
                    .ok_or_else(|| anyhow::anyhow!("stream ended"))?;
                let alive = resp.ttls.iter().filter(|t| **t > 0).count();
                anyhow::ensure!(alive == leases.len(), "only {alive} leases alive");
                if measuring_from.is_none() {
                    measuring_from = Some((Instant::now(), cpu_ticks(args.pid)?));
                }
                tokio::time::sleep(interval.saturating_sub(t.elapsed())).await;
            }
        }
        "etcd" => {
            let mut grpc = tonic::client::Grpc::new(channel);
            grpc.ready().await?;
            let (tx, rx) = tokio::sync::mpsc::channel(65_536);
            // etcd (grpc-go) sends response headers with its first answer,
            // so requests must flow before the call can return: the sender
            // runs on its own, one round of requests per interval.
            let ids = leases.clone();
            let total = (args.duration_secs / args.interval_secs).max(2);
            tokio::spawn(async move {
                for _ in 0..total {
                    let t = Instant::now();
                    for id in &ids {
                        if tx.send(PbLeaseKeepAliveRequest { id: *id }).await.is_err() {
                            return;
                        }
                    }
                    tokio::time::sleep(interval.saturating_sub(t.elapsed())).await;
                }
            });
            let codec = tonic_prost::ProstCodec::<PbLeaseKeepAliveRequest, PbLeaseKeepAliveResponse>::default();
            let mut responses = grpc
                .streaming(
                    tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(rx)),
                    PathAndQuery::from_static("/etcdserverpb.Lease/LeaseKeepAlive"),
                    codec,
                )
                .await?
                .into_inner();
            while rounds < total {
                rounds += 1;
                let mut alive = 0;
                for _ in 0..leases.len() {
                    let resp = responses
                        .message()
                        .await?
                        .ok_or_else(|| anyhow::anyhow!("stream ended"))?;
                    if resp.ttl > 0 {
                        alive += 1;
                    }
                }
                anyhow::ensure!(alive == leases.len(), "only {alive} leases alive");
                if measuring_from.is_none() {
                    measuring_from = Some((Instant::now(), cpu_ticks(args.pid)?));
                }
            }
        }
        other => anyhow::bail!("--mode {other}: use latchkey or etcd"),
    }
    let (from, ticks) = measuring_from.ok_or_else(|| anyhow::anyhow!("no round completed"))?;
    let cpu = (cpu_ticks(args.pid)? - ticks) as f64 / 100.0;
    let wall = from.elapsed().as_secs_f64();
    println!(
        "{} leases every {} s, {rounds} rounds: server CPU {cpu:.2} s in {wall:.1} s = {:.1}% of one core",
        leases.len(),
        args.interval_secs,
        100.0 * cpu / wall
    );
    Ok(())
}
