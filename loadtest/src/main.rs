//! `latchkey-loadtest`: runs latchkey (and etcd, as the reference) as real
//! processes on loopback and puts them under load or under faults.
//!
//! - `chaos`: the fault-injection safety suite ([`chaos`]): a seeded mix
//!   of partitions, crashes, pauses, disk fail points and restarts under a
//!   recorded workload, ending with a verdict (linearizable or not, and
//!   every invariant).
//! - `cluster up | down`: a local cell and proxies (or etcd) as processes
//!   that outlive the command ([`cluster`]).
//! - `kv`, `cas`, `lease-grants`, `sessions`, `watch-fanout`, `locks`,
//!   `move`, `failover`, `slow-watcher`, `mass-expiry`: load scenarios against a
//!   running cluster ([`scenario`]), each with live progress, one JSON
//!   result line and a table; exit status 1 when a safety counter (expired
//!   sessions, missed events, lock violations) is not zero.
//! - `report`: their result lines as one HTML page ([`report`]).
//! - `compare`: workloads against latchkey and etcd, interleaved, and
//!   their ratios ([`compare`]).

mod binaries;
mod chaos;
mod cluster;
mod compare;
mod directory_api;
mod html;
mod report;
mod scenario;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser)]
#[command(name = "latchkey-loadtest", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Faults at random (reproducible by seed) under a recorded workload;
    /// heal, check, verdict. Exit status 0: linearizable and every
    /// invariant held; 1: a violation (history and report written).
    Chaos(chaos::ChaosArgs),
    /// Starts (`up`) or stops (`down`) a local cluster of real processes.
    Cluster(cluster::ClusterArgs),
    /// Puts and gets in a closed loop: ops/s, p50/p99/p999.
    Kv(scenario::kv::KvArgs),
    /// Counters incremented with compare-and-swap txns: committed
    /// increments/s, lost races; lost or phantom increments (must be 0).
    Cas(scenario::cas::CasArgs),
    /// Leases granted in a closed loop (revoked at the end): grants/s and
    /// latency; duplicate lease IDs (must be 0).
    LeaseGrants(scenario::lease_grants::LeaseGrantsArgs),
    /// Many sessions kept alive through the proxies: spurious expiries
    /// (must be 0), keep-alives/s and latency, refresh batches the cell
    /// sees per tick, CPU and memory.
    Sessions(scenario::sessions::SessionsArgs),
    /// Many watchers of one key across the proxies, then writes: delivery
    /// p50/p99/max, missed events (must be 0), upstream watches.
    WatchFanout(scenario::watch_fanout::WatchFanoutArgs),
    /// Contenders on locks with a fenced resource: acquisitions/s,
    /// acquire latency, violations (must be 0).
    Locks(scenario::locks::LocksArgs),
    /// Moves a prefix between two cells and back under writes, sessions
    /// and locks on it: each move's write pause; lost writes, expired
    /// sessions and lock violations (must be 0).
    Move(scenario::moves::MoveArgs),
    /// Sessions and writes while the leader is killed and a follower is
    /// paused: time to a new leader, write unavailability, expired
    /// sessions (must be 0).
    Failover(scenario::failover::FailoverArgs),
    /// Writes/s alone and with a watcher that stopped reading; the stalled
    /// watcher loses nothing silently (must be 0).
    SlowWatcher(scenario::slow_watcher::SlowWatcherArgs),
    /// Write latency while many leases expire together; none is left
    /// behind (must be 0).
    MassExpiry(scenario::mass_expiry::MassExpiryArgs),
    /// Result files (from --out) as one HTML page: figures, latency over
    /// time, histograms, and latchkey/etcd ratios.
    Report(report::ReportArgs),
    /// The same workloads against latchkey and etcd, interleaved; a table
    /// of latchkey/etcd ratios.
    Compare(compare::CompareArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("latchkey-loadtest: cannot start the runtime: {e}");
            return ExitCode::from(2);
        }
    };
    match cli.command {
        Command::Chaos(args) => runtime.block_on(chaos::main(args)),
        Command::Cluster(args) => runtime.block_on(cluster::main(args)),
        Command::Kv(args) => runtime.block_on(scenario::kv::main(args)),
        Command::Cas(args) => runtime.block_on(scenario::cas::main(args)),
        Command::LeaseGrants(args) => runtime.block_on(scenario::lease_grants::main(args)),
        Command::Sessions(args) => runtime.block_on(scenario::sessions::main(args)),
        Command::WatchFanout(args) => runtime.block_on(scenario::watch_fanout::main(args)),
        Command::Locks(args) => runtime.block_on(scenario::locks::main(args)),
        Command::Move(args) => runtime.block_on(scenario::moves::main(args)),
        Command::Failover(args) => runtime.block_on(scenario::failover::main(args)),
        Command::SlowWatcher(args) => runtime.block_on(scenario::slow_watcher::main(args)),
        Command::MassExpiry(args) => runtime.block_on(scenario::mass_expiry::main(args)),
        Command::Report(args) => report::main(args),
        Command::Compare(args) => compare::main(args),
    }
}

#[cfg(test)]
mod tests {
    use super::Cli;
    use clap::CommandFactory;

    /// Every subcommand's flags are well formed (unique names, existing
    /// `requires` targets): clap checks them only when a subcommand is
    /// parsed, so a clash in one scenario would otherwise show only when
    /// that scenario runs (a shared `--key` once broke `watch-fanout`).
    #[test]
    fn every_subcommand_s_flags_are_well_formed() {
        Cli::command().debug_assert();
    }
}
