//! `latchkey-loadtest`: runs latchkey (and etcd, as the reference) as real
//! processes on loopback and puts them under load or under faults.
//!
//! - `chaos`: the fault-injection safety suite ([`chaos`]): a seeded mix
//!   of partitions, crashes, pauses, disk fail points and restarts under a
//!   recorded workload, ending with a verdict (linearizable or not, and
//!   every invariant).
//! - `cluster up | down`: a local cell and proxies (or etcd) as processes
//!   that outlive the command ([`cluster`]).

mod binaries;
mod chaos;
mod cluster;

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
    }
}
