//! `latchkey-cell`: parses flags, installs what is process-wide (logs,
//! metrics recorder, signals), runs one member until a signal or until the
//! member stops on its own, then shuts it down.

use clap::Parser;
use latchkey_cell::cell::{Cell, Stopped};
use latchkey_cell::config::Config;
use latchkey_shared::{lifecycle, telemetry};
use std::process::ExitCode;

/// jemalloc, not the C library's malloc: glibc keeps what a thread frees
/// in that thread's arena and returns only the free space at an arena's
/// top. After one round of `latchkey-loadtest compare` a member's arenas
/// held 113 MB of which 78 MB was in use (`malloc_stats()`), and
/// `malloc_trim(0)` gave back 17-21 MB of each member's RSS. jemalloc's
/// background thread returns pages left free for its decay time (10 s).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> ExitCode {
    match Config::parse().resolve() {
        Ok(cfg) => lifecycle::run_main("latchkey-cell", run(cfg)),
        Err(e) => {
            eprintln!("latchkey-cell: {e:#}");
            ExitCode::from(2)
        }
    }
}

async fn run(cfg: latchkey_cell::config::Resolved) -> anyhow::Result<()> {
    telemetry::init_tracing(&cfg.cfg.log).map_err(anyhow::Error::msg)?;
    #[cfg(debug_assertions)]
    latchkey_cell::chaos::switch_on(cfg.cfg.unsafe_fail_points, &cfg.cfg.unsafe_break);
    let prometheus = telemetry::install_prometheus().map_err(anyhow::Error::msg)?;
    let cell = Cell::start(cfg, Some(prometheus)).await?;
    let failed = tokio::select! {
        _ = telemetry::shutdown_signal() => {
            tracing::info!("stopping");
            None
        }
        why = cell.stopped() => match why {
            Stopped::Removed => None,
            Stopped::ServerFailed(e) | Stopped::RaftFailed(e) => Some(e),
        },
    };
    cell.shutdown().await?;
    match failed {
        Some(e) => anyhow::bail!("{e}"),
        None => Ok(()),
    }
}
