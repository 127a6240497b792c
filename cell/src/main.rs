use clap::Parser;
use latchkey_cell::config::Config;

fn main() -> std::process::ExitCode {
    let cfg = Config::parse();
    let resolved = match cfg.resolve() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("latchkey-cell: {e:#}");
            return std::process::ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("latchkey-cell: cannot start the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(latchkey_cell::startup::run(resolved)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("latchkey-cell: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
