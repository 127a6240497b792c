//! `latchkey-proxy`: parses flags, installs what is process-wide (logs,
//! metrics recorder, signals), starts the proxy (and with `--dev` a
//! one-member cell in the same process), runs until a signal.

use clap::Parser;
use latchkey_proxy::config::Config;
use latchkey_proxy::dev;
use latchkey_proxy::proxy::Proxy;
use latchkey_shared::{lifecycle, telemetry};
use std::process::ExitCode;

/// jemalloc, as the cell: on glibc's malloc, a `perf` profile of the
/// proxies serving cached serializable reads had 14 % of their samples in
/// malloc and free (`_int_malloc`, `unlink_chunk`, `malloc_consolidate`).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> ExitCode {
    // `latchkey-proxy directory ...`: the operators' command line for the
    // directory of cells, a client of a running proxy.
    if std::env::args_os().nth(1).is_some_and(|a| a == "directory") {
        return latchkey_proxy::directory_cli::main(std::env::args_os().skip(1));
    }
    match Config::parse().validate() {
        Ok(cfg) => lifecycle::run_main("latchkey-proxy", run(cfg)),
        Err(e) => {
            eprintln!("latchkey-proxy: {e:#}");
            ExitCode::from(2)
        }
    }
}

async fn run(mut cfg: Config) -> anyhow::Result<()> {
    telemetry::init_tracing(&cfg.log).map_err(anyhow::Error::msg)?;
    #[cfg(debug_assertions)]
    {
        use latchkey_proxy::chaos::{switch_on, Defect};
        if cfg.unsafe_retry_ambiguous_writes {
            switch_on(Defect::RetryAmbiguousWrites);
        }
        if cfg.unsafe_forget_write_floors {
            switch_on(Defect::ForgetWriteFloors);
        }
        if cfg.unsafe_unfenced_moves {
            switch_on(Defect::UnfencedMoves);
        }
    }
    let prometheus = telemetry::install_prometheus().map_err(anyhow::Error::msg)?;
    let cell = if cfg.dev {
        let key_file = dev::proxy_key_file(&cfg)?;
        let cell = dev::start_cell(&cfg.data_dir, &key_file, Some(prometheus.clone())).await?;
        cfg.proxy_key_file = Some(key_file);
        cfg.cells = vec![cell.client_addr.to_string()];
        Some(cell)
    } else {
        None
    };
    let mut proxy = Proxy::start(cfg, Some(prometheus)).await?;
    if cell.is_some() {
        println!("{}", dev::try_these(&proxy.http_addr, &proxy.grpc_addr));
    }
    let failed = tokio::select! {
        _ = telemetry::shutdown_signal() => {
            tracing::info!("stopping");
            None
        }
        e = proxy.failed() => Some(e),
    };
    proxy.shutdown().await?;
    if let Some(cell) = cell {
        cell.shutdown().await?;
    }
    match failed {
        Some(e) => Err(e),
        None => Ok(()),
    }
}
