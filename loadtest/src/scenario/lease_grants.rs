//! `lease-grants`: leases granted in a closed loop over etcd's gRPC API,
//! as clients open sessions: grants/s and their latency. The leases are
//! revoked after the measured phase (not timed), so that a run leaves
//! nothing to expire under the next one.
//!
//! What must hold: every grant answers a lease ID no other grant of the
//! run answered (duplicate IDs: 0), and every granted lease can be
//! revoked, or is already gone.

use super::load::{closed_loop, revoke, within, Step, Workers};
use super::recorder::{Progress, Recorder};
use super::{drive, Common, CpuMeter, Endpoints, Outcome};
use etcd_client::Client;
use std::collections::HashSet;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

#[derive(clap::Args, Debug)]
pub struct LeaseGrantsArgs {
    #[command(flatten)]
    common: Common,
    #[command(flatten)]
    workers: Workers,
    /// The leases' TTL in seconds (they are revoked at the end; this is
    /// how long one outlives a run that is killed).
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(i64).range(2..=3600))]
    ttl: i64,
}

pub async fn main(args: LeaseGrantsArgs) -> ExitCode {
    let args = &args;
    drive("lease-grants", &args.common, |endpoints| async move {
        run(args, &endpoints).await
    })
    .await
}

async fn run(args: &LeaseGrantsArgs, endpoints: &Endpoints) -> Result<Outcome, String> {
    let timeout = args.common.op_timeout;
    let front = endpoints.require_grpc()?;
    let clients = args.workers.connect(front, timeout, None).await?;

    let grants = Arc::new(Recorder::new());
    let cpu_cells = CpuMeter::start(&endpoints.cell_pids);
    let cpu_proxies = CpuMeter::start(&endpoints.proxy_pids);
    let progress = Progress::show("lease-grants", grants.clone(), args.common.duration);
    let ttl = args.ttl;
    let op = move |mut client: Client, mut granted: Vec<i64>| async move {
        let step = within(timeout, "lease grant", client.lease_grant(ttl, None))
            .await
            .map(|answer| {
                granted.push(answer.id());
                Step::Done
            });
        (granted, step)
    };
    let granted = closed_loop(
        &clients,
        args.workers.clients,
        &args.common,
        &grants,
        |_| Vec::new(),
        op,
    )
    .await?;
    progress.finish();
    let cell_cpu = cpu_cells.percent();
    let proxy_cpu = cpu_proxies.percent();

    let ids: Vec<i64> = granted.into_iter().flatten().collect();
    let distinct: HashSet<i64> = ids.iter().copied().collect();
    let duplicates = (ids.len() - distinct.len()) as u64;
    let revoking = Instant::now();
    let not_revoked = revoke(&clients, &ids, timeout).await;
    let revoke_s = revoking.elapsed().as_secs_f64();

    let mut o = Outcome::new("lease-grants", endpoints.target);
    args.workers.describe(&mut o);
    o.field("ttl_s", args.ttl);
    o.field("endpoints", front.to_vec());
    let elapsed = grants.elapsed().as_secs_f64();
    o.figure("duration_s", elapsed, format!("{elapsed:.1} s"));
    let rate = grants.rate();
    o.figure("grants_per_s", rate, format!("{rate:.0}"));
    o.latency("grant", &grants.latency());
    o.safety("duplicate_ids", duplicates);
    o.figure(
        "revoked_after_s",
        revoke_s,
        format!("{} leases in {revoke_s:.1} s (not timed)", ids.len()),
    );
    o.safety("not_revoked", not_revoked.0);
    o.field("first_not_revoked", not_revoked.1);
    o.errors(grants.errors(), grants.first_error());
    o.maybe("cell_cpu_percent", cell_cpu, "% of a core");
    o.maybe("proxy_cpu_percent", proxy_cpu, "% of a core");
    o.series(grants.series());
    Ok(o)
}
