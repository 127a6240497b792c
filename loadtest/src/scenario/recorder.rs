//! What a scenario measures while it runs: operations, errors and their
//! latency (an HDR histogram over the whole run, and one per second for
//! the latency-over-time series), and the live progress line on stderr.

use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::Serialize;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The largest latency a histogram holds, in microseconds (one hour);
/// anything longer is recorded as this.
const MAX_US: u64 = 3_600_000_000;

/// One second (or so) of a run: what the latency-over-time plots draw.
#[derive(Debug, Clone, Serialize)]
pub struct Sample {
    /// Seconds since the recorder started, at the end of the window.
    pub t_s: f64,
    pub ops_per_s: f64,
    pub errors: u64,
    pub p50_ms: f64,
    pub p99_ms: f64,
}

/// A latency distribution, summarised.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Latency {
    pub count: u64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    pub max_ms: f64,
    /// `[upper bound in ms, count]` in buckets doubling from 0.1 ms: what
    /// the report's histograms draw.
    pub buckets: Vec<(f64, u64)>,
}

impl Latency {
    fn of(h: &Histogram<u64>) -> Latency {
        if h.is_empty() {
            return Latency::default();
        }
        let ms = |us: u64| us as f64 / 1000.0;
        Latency {
            count: h.len(),
            p50_ms: ms(h.value_at_quantile(0.50)),
            p99_ms: ms(h.value_at_quantile(0.99)),
            p999_ms: ms(h.value_at_quantile(0.999)),
            max_ms: ms(h.max()),
            buckets: h
                .iter_log(100, 2.0)
                .map(|b| (ms(b.value_iterated_to()), b.count_since_last_iteration()))
                .collect(),
        }
    }

    /// A summary of latencies measured after the fact (microseconds).
    pub fn of_micros(latencies_us: impl IntoIterator<Item = u64>) -> Latency {
        let mut h = histogram();
        for us in latencies_us {
            h.saturating_record(us.clamp(1, MAX_US));
        }
        Latency::of(&h)
    }
}

fn histogram() -> Histogram<u64> {
    // Three significant digits from 1 µs to an hour: bounds that are
    // valid by construction.
    Histogram::new_with_bounds(1, MAX_US, 3).unwrap_or_else(|_| {
        Histogram::new(3).unwrap_or_else(|_| unreachable!("3 significant digits are allowed"))
    })
}

struct Windows {
    total: Histogram<u64>,
    window: Histogram<u64>,
    window_errors: u64,
    window_started: Instant,
    series: Vec<Sample>,
}

/// Counts and latencies of one kind of operation, shared by every worker.
pub struct Recorder {
    started: Instant,
    /// When its phase ended (rates count up to here, not to the report).
    ended: Mutex<Option<Instant>>,
    ok: AtomicU64,
    errors: AtomicU64,
    windows: Mutex<Windows>,
    first_error: Mutex<Option<String>>,
}

impl Default for Recorder {
    fn default() -> Self {
        Recorder::new()
    }
}

impl Recorder {
    pub fn new() -> Recorder {
        let now = Instant::now();
        Recorder {
            started: now,
            ended: Mutex::new(None),
            ok: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            windows: Mutex::new(Windows {
                total: histogram(),
                window: histogram(),
                window_errors: 0,
                window_started: now,
                series: Vec::new(),
            }),
            first_error: Mutex::new(None),
        }
    }

    fn windows(&self) -> MutexGuard<'_, Windows> {
        self.windows.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// One operation done, which took `latency`.
    pub fn ok(&self, latency: Duration) {
        self.ok_many(1, latency);
    }

    /// `n` operations done together (one round of many keep-alives), the
    /// round taking `latency`: an upper bound for each.
    pub fn ok_many(&self, n: u64, latency: Duration) {
        self.ok.fetch_add(n, Ordering::Relaxed);
        let us = (latency.as_micros() as u64).clamp(1, MAX_US);
        let mut w = self.windows();
        let _ = w.total.record_n(us, n);
        let _ = w.window.record_n(us, n);
    }

    /// One operation failed; the first failure is kept to show.
    pub fn error(&self, e: impl std::fmt::Display) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        self.windows().window_errors += 1;
        let mut first = self.first_error.lock().unwrap_or_else(|p| p.into_inner());
        if first.is_none() {
            *first = Some(e.to_string());
        }
    }

    pub fn done(&self) -> u64 {
        self.ok.load(Ordering::Relaxed)
    }

    pub fn errors(&self) -> u64 {
        self.errors.load(Ordering::Relaxed)
    }

    pub fn first_error(&self) -> Option<String> {
        self.first_error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub fn latency(&self) -> Latency {
        Latency::of(&self.windows().total)
    }

    /// From its start to the end of its phase (or to now while it runs).
    pub fn elapsed(&self) -> Duration {
        let ended = *self.ended.lock().unwrap_or_else(|p| p.into_inner());
        ended.unwrap_or_else(Instant::now) - self.started
    }

    /// Its phase is over: rates stop counting time.
    pub fn end(&self) {
        let mut ended = self.ended.lock().unwrap_or_else(|p| p.into_inner());
        ended.get_or_insert_with(Instant::now);
    }

    /// Operations per second since the recorder started.
    pub fn rate(&self) -> f64 {
        self.done() as f64 / self.elapsed().as_secs_f64().max(1e-9)
    }

    /// Closes the current window into the series and opens the next.
    fn roll(&self) -> Sample {
        let now = Instant::now();
        let mut w = self.windows();
        let secs = now.duration_since(w.window_started).as_secs_f64().max(1e-9);
        let lat = Latency::of(&w.window);
        let sample = Sample {
            t_s: now.duration_since(self.started).as_secs_f64(),
            ops_per_s: lat.count as f64 / secs,
            errors: w.window_errors,
            p50_ms: lat.p50_ms,
            p99_ms: lat.p99_ms,
        };
        w.window.reset();
        w.window_errors = 0;
        w.window_started = now;
        w.series.push(sample.clone());
        sample
    }

    fn window_has_data(&self) -> bool {
        let w = self.windows();
        !w.window.is_empty() || w.window_errors > 0
    }

    /// Every closed window so far.
    pub fn series(&self) -> Vec<Sample> {
        self.windows().series.clone()
    }
}

/// The live progress line of one phase: a bar while the phase has a known
/// end, and the rate, errors and p99 so far. Hidden when stderr is not a
/// terminal (indicatif's rule), so logs get only the result.
pub struct Progress {
    bar: ProgressBar,
    recorder: Arc<Recorder>,
    ticker: tokio::task::JoinHandle<()>,
}

impl Progress {
    /// Shows `recorder` under `label` for a phase of `length`, rolling its
    /// per-second window each second (so the series exists even when
    /// nothing is drawn).
    pub fn show(label: &str, recorder: Arc<Recorder>, length: Duration) -> Progress {
        let bar = ProgressBar::with_draw_target(
            Some(length.as_millis() as u64),
            ProgressDrawTarget::stderr_with_hz(4),
        );
        bar.set_style(
            ProgressStyle::with_template("{prefix:>12} [{bar:30}] {elapsed:>4}/{duration:4} {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
        );
        bar.set_prefix(label.to_string());
        let (shown, shown_recorder) = (bar.clone(), recorder.clone());
        let ticker = tokio::spawn(async move {
            let mut every = tokio::time::interval(Duration::from_secs(1));
            every.tick().await;
            loop {
                every.tick().await;
                let sample = recorder.roll();
                let total = recorder.latency();
                shown.set_position(recorder.elapsed().as_millis() as u64);
                shown.set_message(format!(
                    "{:>8.0}/s  errors {}  p99 {:.1} ms (this second {:.1} ms)",
                    sample.ops_per_s,
                    recorder.errors(),
                    total.p99_ms,
                    sample.p99_ms
                ));
            }
        });
        Progress {
            bar,
            recorder: shown_recorder,
            ticker,
        }
    }

    /// The phase is over: the bar goes and the recorder's clock stops.
    pub fn finish(self) {
        self.ticker.abort();
        // The last part of a second is a sample too (short phases have
        // little else).
        if self.recorder.window_has_data() {
            self.recorder.roll();
        }
        self.recorder.end();
        self.bar.finish_and_clear();
    }
}

/// A counter bar for a phase measured in items (sessions created,
/// watches opened).
pub fn counter(label: &str, total: u64) -> ProgressBar {
    let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr_with_hz(4));
    bar.set_style(
        ProgressStyle::with_template("{prefix:>12} [{bar:30}] {pos}/{len} {per_sec} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    bar.set_prefix(label.to_string());
    bar
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latency_and_series_come_from_what_was_recorded() {
        let r = Recorder::new();
        for ms in 1..=100 {
            r.ok(Duration::from_millis(ms));
        }
        r.error("refused");
        r.error("refused again");
        let lat = r.latency();
        assert_eq!(lat.count, 100);
        assert!((49.0..=51.0).contains(&lat.p50_ms), "{lat:?}");
        assert!((98.0..=100.5).contains(&lat.p99_ms), "{lat:?}");
        assert_eq!(r.errors(), 2);
        assert_eq!(r.first_error().as_deref(), Some("refused"));
        let s = r.roll();
        assert_eq!(s.errors, 2);
        assert!(s.p99_ms >= 98.0, "{s:?}");
        // The next window starts empty; the whole run's figures stay.
        let next = r.roll();
        assert_eq!((next.errors, next.p99_ms), (0, 0.0));
        assert_eq!(r.series().len(), 2);
        assert_eq!(r.latency().count, 100);
        // Once its phase ends, its clock (and so its rate) stops.
        r.end();
        let frozen = r.elapsed();
        std::thread::sleep(Duration::from_millis(5));
        assert_eq!(r.elapsed(), frozen);
    }

    #[test]
    fn a_round_counts_each_of_its_operations() {
        let r = Recorder::new();
        r.ok_many(500, Duration::from_millis(3));
        assert_eq!(r.done(), 500);
        assert_eq!(r.latency().count, 500);
        assert_eq!(Latency::of_micros([]).count, 0);
        let two = Latency::of_micros([2_000, 4_000]);
        assert!((4.0..4.01).contains(&two.max_ms), "{two:?}");
        // Buckets double from 0.1 ms and hold every sample once.
        assert_eq!(two.buckets.iter().map(|(_, n)| n).sum::<u64>(), 2);
        assert!(two.buckets.windows(2).all(|w| w[1].0 > w[0].0), "{two:?}");
    }
}
