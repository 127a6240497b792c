//! Owning background work: every task a component starts is spawned
//! through its [`Lifecycle`], which can stop them all and wait until none
//! is left. A process (or a test, or a proxy embedding a cell) that drops a
//! component after `shutdown` knows nothing of it still runs.

use std::future::Future;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// One shutdown signal and the tasks that obey it. Clones share both.
#[derive(Clone, Default)]
pub struct Lifecycle {
    token: CancellationToken,
    tasks: TaskTracker,
}

impl Lifecycle {
    pub fn new() -> Self {
        Lifecycle::default()
    }

    /// Spawns `work`, dropped at its next `.await` once shutdown begins:
    /// for work that holds nothing that must be finished (a stream being
    /// served, a periodic job).
    pub fn spawn<F>(&self, work: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let token = self.token.clone();
        self.tasks.spawn(async move {
            tokio::select! {
                _ = token.cancelled() => {}
                _ = work => {}
            }
        });
    }

    /// Spawns a task that watches the token itself (it is handed one) and
    /// finishes its own work before it returns.
    pub fn spawn_owned<F, Fut>(&self, work: F)
    where
        F: FnOnce(CancellationToken) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.tasks.spawn(work(self.token.clone()));
    }

    /// The token tasks watch; cancelled when shutdown begins.
    pub fn token(&self) -> CancellationToken {
        self.token.clone()
    }

    pub fn is_stopping(&self) -> bool {
        self.token.is_cancelled()
    }

    /// Resolves once shutdown has begun.
    pub async fn stopping(&self) {
        self.token.cancelled().await
    }

    /// Tasks still running.
    pub fn live_tasks(&self) -> usize {
        self.tasks.len()
    }

    /// Begins shutdown and waits up to `grace` for every task to end.
    /// Returns how many were still running then (0 = all ended).
    pub async fn shutdown(&self, grace: Duration) -> usize {
        self.token.cancel();
        self.tasks.close();
        let _ = tokio::time::timeout(grace, self.tasks.wait()).await;
        self.tasks.len()
    }
}

/// A binary's `main` after its flags are parsed: runs `work` on a
/// multi-threaded runtime and turns its outcome into the exit code,
/// printing a failure as `name: error` (with its causes).
pub fn run_main<F, E>(name: &str, work: F) -> std::process::ExitCode
where
    F: Future<Output = Result<(), E>>,
    E: std::fmt::Display,
{
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("{name}: cannot start the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(work) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{name}: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn shutdown_ends_every_task_it_spawned() {
        let life = Lifecycle::new();
        life.spawn(std::future::pending());
        life.spawn_owned(|token| async move { token.cancelled().await });
        assert_eq!(life.live_tasks(), 2);
        assert_eq!(life.shutdown(Duration::from_secs(1)).await, 0);
        assert!(life.is_stopping());
    }

    #[tokio::test(start_paused = true)]
    async fn a_task_that_ignores_shutdown_is_reported() {
        let life = Lifecycle::new();
        life.spawn_owned(|_token| async move {
            tokio::time::sleep(Duration::from_secs(3600)).await;
        });
        assert_eq!(life.shutdown(Duration::from_secs(1)).await, 1);
    }
}
