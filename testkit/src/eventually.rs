//! The one poll-until-deadline loop.

use std::fmt::Display;
use std::future::Future;
use std::panic::Location;
use tokio::time::{sleep, timeout_at, Duration, Instant};

/// Calls `probe` until it returns `Ok`, and returns that value. `Err`
/// says why not yet; if `timeout` passes first (also in the middle of a
/// call), this panics with the caller's location and the last `Err`.
///
/// Between calls it sleeps a hundredth of `timeout`, at least 20 ms (no
/// busy loop against the members) and at most 200 ms (a condition that
/// holds is seen soon after, which keeps measured times honest).
///
/// ```ignore
/// let leader = eventually(Duration::from_secs(5), async || {
///     cluster.leader_seen_by(1).await.ok_or("no leader yet")
/// })
/// .await;
/// ```
#[track_caller]
pub fn eventually<T, E: Display>(
    timeout: Duration,
    probe: impl AsyncFnMut() -> Result<T, E>,
) -> impl Future<Output = T> {
    let caller = Location::caller();
    async move {
        match poll_until(timeout, probe).await {
            Ok(value) => value,
            Err(why) => panic!("{caller}: {why}"),
        }
    }
}

/// [`eventually`] for code that reports rather than panics (a command,
/// not a test): `Err` says why not within `timeout`.
pub async fn poll_until<T, E: Display>(
    timeout: Duration,
    mut probe: impl AsyncFnMut() -> Result<T, E>,
) -> Result<T, String> {
    let deadline = Instant::now() + timeout;
    let pause = (timeout / 100).clamp(Duration::from_millis(20), Duration::from_millis(200));
    let mut why_not = String::from("no try finished");
    let mut tries = 0u32;
    loop {
        tries += 1;
        match timeout_at(deadline, probe()).await {
            Ok(Ok(value)) => return Ok(value),
            Ok(Err(e)) => why_not = e.to_string(),
            Err(_) => {
                return Err(format!(
                    "not within {timeout:?}: try {tries} was still running at the deadline; \
                     the one before said: {why_not}"
                ))
            }
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(format!("not within {timeout:?} ({tries} tries): {why_not}"));
        }
        sleep(pause.min(deadline - now)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::eventually;
    use tokio::time::{sleep, Duration, Instant};

    #[tokio::test(start_paused = true)]
    async fn returns_the_first_ok_and_polls_a_hundredth_of_the_timeout_apart() {
        let started = Instant::now();
        let mut tries = 0;
        let got = eventually(Duration::from_secs(10), async || {
            tries += 1;
            if tries < 4 {
                Err(format!("try {tries}"))
            } else {
                Ok(tries * 10)
            }
        })
        .await;
        assert_eq!(got, 40);
        assert_eq!(started.elapsed(), Duration::from_millis(300));
    }

    #[tokio::test(start_paused = true)]
    #[should_panic(expected = "not within 1s (51 tries): still 7")]
    async fn panics_with_the_last_reason_at_the_deadline() {
        eventually(Duration::from_secs(1), async || Err::<(), _>("still 7")).await;
    }

    #[tokio::test(start_paused = true)]
    async fn the_panic_names_the_caller() {
        let line = line!() + 1;
        let task = tokio::spawn(eventually(Duration::from_millis(100), async || {
            Err::<(), _>("no")
        }));
        let panic = task.await.expect_err("a panic").into_panic();
        let message = panic.downcast_ref::<String>().expect("a formatted message");
        assert!(
            message.starts_with(&format!("{}:{line}:", file!())),
            "{message}"
        );
    }

    #[tokio::test(start_paused = true)]
    #[should_panic(expected = "try 2 was still running at the deadline; the one before said: slow")]
    async fn a_try_that_hangs_is_cut_at_the_deadline() {
        let mut tries = 0;
        eventually(Duration::from_secs(1), async || {
            tries += 1;
            if tries > 1 {
                sleep(Duration::from_secs(3600)).await;
            }
            Err::<(), _>("slow")
        })
        .await;
    }
}
