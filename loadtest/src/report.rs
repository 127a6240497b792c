//! `report`: result files (the JSON lines scenarios append with `--out`)
//! turned into one self-contained HTML page: every run with its figures,
//! its latency over time and its latency histograms (SVG drawn by
//! plotters, inline), and, where one scenario ran against both latchkey
//! and etcd, a table of latchkey/etcd ratios.

use crate::html::escape;
use plotters::prelude::*;
use serde_json::{Map, Value};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args, Debug)]
pub struct ReportArgs {
    /// Result files: JSON lines as `--out` appends them.
    #[arg(required = true)]
    inputs: Vec<PathBuf>,
    /// The HTML page to write.
    #[arg(long, short, default_value = "latchkey-loadtest-report.html")]
    output: PathBuf,
}

pub fn main(args: ReportArgs) -> ExitCode {
    let runs = match read_runs(&args.inputs) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("report: {e}");
            return ExitCode::from(1);
        }
    };
    let page = page(&runs);
    if let Err(e) = std::fs::write(&args.output, page) {
        eprintln!("report: writing {}: {e}", args.output.display());
        return ExitCode::from(1);
    }
    println!(
        "{} runs -> {} ({} compared with etcd)",
        runs.len(),
        args.output.display(),
        comparisons(&runs).len()
    );
    ExitCode::SUCCESS
}

/// One scenario's result line.
type Run = Map<String, Value>;

fn read_runs(inputs: &[PathBuf]) -> Result<Vec<Run>, String> {
    let mut runs = Vec::new();
    for path in inputs {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        for (n, line) in text
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty())
        {
            let at = format!("{}:{}", path.display(), n + 1);
            let v: Value =
                serde_json::from_str(line).map_err(|e| format!("{at}: not JSON: {e}"))?;
            match v {
                Value::Object(run) if run.get("scenario").is_some_and(Value::is_string) => {
                    runs.push(run)
                }
                _ => return Err(format!("{at}: not a scenario's result (no \"scenario\")")),
            }
        }
    }
    if runs.is_empty() {
        return Err("the inputs hold no result".into());
    }
    Ok(runs)
}

fn text(run: &Run, field: &str) -> String {
    run.get(field)
        .and_then(Value::as_str)
        .unwrap_or("?")
        .to_string()
}

/// What a run measured: the workload `compare` named it by (several
/// workloads are one scenario with other arguments), else its scenario.
fn workload(run: &Run) -> String {
    match run.get("workload").and_then(Value::as_str) {
        Some(w) => w.to_string(),
        None => text(run, "scenario"),
    }
}

/// A figure worth comparing, and which way is better: throughput and the
/// `ratio` of slow-watcher (higher), p50/p99 latency and CPU (lower).
/// Offered load (client keep-alives/s, set by the TTL) is not compared,
/// nor are tails (p999, max) that one stall decides.
pub fn better_when_higher(field: &str) -> Option<bool> {
    if field == "keepalives_per_s" {
        None
    } else if field.ends_with("_per_s") || field == "ratio" {
        Some(true)
    } else if field.ends_with("_p50_ms")
        || field.ends_with("_p99_ms")
        || field.ends_with("_cpu_percent")
    {
        Some(false)
    } else {
        None
    }
}

/// One figure of one scenario on both systems.
#[derive(Debug, Clone, PartialEq)]
pub struct Ratio {
    pub scenario: String,
    pub figure: String,
    pub latchkey: f64,
    pub etcd: f64,
    /// latchkey / etcd.
    pub ratio: f64,
    /// Whether latchkey is at least as good as etcd on this figure.
    pub latchkey_ahead: bool,
}

impl Ratio {
    /// `latchkey` against `etcd` on one figure; `higher` says which way
    /// is better.
    pub fn of(scenario: &str, figure: &str, higher: bool, latchkey: f64, etcd: f64) -> Ratio {
        Ratio {
            scenario: scenario.to_string(),
            figure: figure.to_string(),
            latchkey,
            etcd,
            ratio: latchkey / etcd,
            latchkey_ahead: if higher {
                latchkey >= etcd
            } else {
                latchkey <= etcd
            },
        }
    }
}

/// For each workload (or scenario) run on both systems, the last run of
/// each compared figure by figure (rates, latencies and CPU only).
pub fn comparisons(runs: &[Run]) -> Vec<Ratio> {
    let mut out = Vec::new();
    let mut scenarios: Vec<String> = runs.iter().map(workload).collect();
    scenarios.sort();
    scenarios.dedup();
    for scenario in scenarios {
        let last = |target: &str| {
            runs.iter()
                .rev()
                .find(|r| workload(r) == scenario && text(r, "target") == target)
        };
        let (Some(l), Some(e)) = (last("latchkey"), last("etcd")) else {
            continue;
        };
        for (field, lv) in l {
            let Some(higher) = better_when_higher(field) else {
                continue;
            };
            let (Some(lv), Some(ev)) = (lv.as_f64(), e.get(field).and_then(Value::as_f64)) else {
                continue;
            };
            if ev == 0.0 {
                continue;
            }
            out.push(Ratio::of(&scenario, field, higher, lv, ev));
        }
    }
    out
}

fn page(runs: &[Run]) -> String {
    let mut h = String::new();
    h.push_str(
        "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>latchkey load test</title>\n\
         <style>body{font-family:sans-serif;max-width:1100px;margin:2em auto}\
         table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}\
         .bad{color:#b00;font-weight:bold}.ok{color:#070}section{margin-top:2.5em}\
         .plots{display:flex;flex-wrap:wrap;gap:1em}</style></head><body>\n\
         <h1>latchkey load test</h1>\n",
    );
    let _ = writeln!(h, "<h2>Runs</h2><table id=\"runs\"><tr><th>#</th><th>scenario</th><th>target</th><th>unix time</th><th>safety counters</th></tr>");
    for (i, run) in runs.iter().enumerate() {
        let _ = writeln!(
            h,
            "<tr><td><a href=\"#run-{i}\">{i}</a></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            escape(&workload(run)),
            escape(&text(run, "target")),
            run.get("unix_time").map(Value::to_string).unwrap_or_default(),
            safety(run)
        );
    }
    h.push_str("</table>\n");

    let ratios = comparisons(runs);
    h.push_str("<h2>latchkey / etcd</h2>\n");
    if ratios.is_empty() {
        h.push_str("<p>No scenario ran against both latchkey and etcd in these results.</p>\n");
    } else {
        h.push_str("<table id=\"comparison\"><tr><th>scenario</th><th>figure</th><th>latchkey</th><th>etcd</th><th>latchkey / etcd</th></tr>\n");
        for r in &ratios {
            let class = if r.latchkey_ahead { "ok" } else { "bad" };
            let _ = writeln!(
                h,
                "<tr><td>{}</td><td>{}</td><td>{:.2}</td><td>{:.2}</td><td class=\"{class}\">{:.2}</td></tr>",
                escape(&r.scenario),
                escape(&r.figure),
                r.latchkey,
                r.etcd,
                r.ratio
            );
        }
        h.push_str("</table>\n");
    }

    for (i, run) in runs.iter().enumerate() {
        let _ = writeln!(
            h,
            "<section id=\"run-{i}\"><h2>{i}. {} on {}</h2>",
            escape(&workload(run)),
            escape(&text(run, "target"))
        );
        h.push_str("<div class=\"plots\">");
        if let Some(svg) = run.get("series").and_then(series_plot) {
            let _ = write!(h, "<figure class=\"plot over-time\">{svg}</figure>");
        }
        for (field, value) in run.iter().filter(|(f, _)| f.ends_with("_histogram")) {
            let name = field.trim_end_matches("_histogram");
            if let Some(svg) = histogram_plot(name, value) {
                let _ = write!(h, "<figure class=\"plot histogram\">{svg}</figure>");
            }
        }
        h.push_str("</div><table class=\"figures\">");
        for (field, value) in run {
            if field == "series" || field.ends_with("_histogram") {
                continue;
            }
            let shown = match value {
                Value::Number(n) => n
                    .as_f64()
                    .map(|f| {
                        if f.fract() == 0.0 {
                            format!("{f:.0}")
                        } else {
                            format!("{f:.3}")
                        }
                    })
                    .unwrap_or_default(),
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            let _ = write!(
                h,
                "<tr><td>{}</td><td>{}</td></tr>",
                escape(field),
                escape(&shown)
            );
        }
        h.push_str("</table></section>\n");
    }
    h.push_str("</body></html>\n");
    h
}

fn safety(run: &Run) -> String {
    let names: Vec<&str> = run
        .get("safety_counters")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    if names.is_empty() {
        return "none".into();
    }
    names
        .iter()
        .map(|n| {
            let v = run.get(*n).and_then(Value::as_u64).unwrap_or(u64::MAX);
            let class = if v == 0 { "ok" } else { "bad" };
            format!("<span class=\"{class}\">{} = {v}</span>", escape(n))
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// p50 and p99 over time, from a run's per-second series.
fn series_plot(series: &Value) -> Option<String> {
    let points: Vec<(f64, f64, f64)> = series
        .as_array()?
        .iter()
        .filter_map(|s| {
            Some((
                s["t_s"].as_f64()?,
                s["p50_ms"].as_f64()?,
                s["p99_ms"].as_f64()?,
            ))
        })
        .collect();
    if points.is_empty() {
        return None;
    }
    let max_t = points.iter().map(|p| p.0).fold(1.0, f64::max);
    let max_y = points.iter().map(|p| p.2.max(p.1)).fold(1.0, f64::max) * 1.1;
    let mut svg = String::new();
    let drawn = (|| -> Result<(), Box<dyn std::error::Error + '_>> {
        let root = SVGBackend::with_string(&mut svg, (520, 300)).into_drawing_area();
        root.fill(&WHITE)?;
        let mut chart = ChartBuilder::on(&root)
            .caption("latency over time", ("sans-serif", 16))
            .margin(10)
            .x_label_area_size(30)
            .y_label_area_size(50)
            .build_cartesian_2d(0f64..max_t, 0f64..max_y)?;
        chart
            .configure_mesh()
            .x_desc("seconds")
            .y_desc("ms")
            .draw()?;
        chart
            .draw_series(LineSeries::new(points.iter().map(|p| (p.0, p.1)), &BLUE))?
            .label("p50")
            .legend(|(x, y)| PathElement::new([(x, y), (x + 15, y)], BLUE));
        chart
            .draw_series(LineSeries::new(points.iter().map(|p| (p.0, p.2)), &RED))?
            .label("p99")
            .legend(|(x, y)| PathElement::new([(x, y), (x + 15, y)], RED));
        chart
            .configure_series_labels()
            .background_style(WHITE)
            .border_style(BLACK)
            .draw()?;
        root.present()?;
        Ok(())
    })();
    drawn.ok()?;
    Some(svg)
}

/// A latency histogram from `[upper ms, count]` buckets (doubling widths,
/// drawn as equal-width bars labelled by their upper bound).
fn histogram_plot(name: &str, buckets: &Value) -> Option<String> {
    let bars: Vec<(f64, u64)> = buckets
        .as_array()?
        .iter()
        .filter_map(|b| Some((b.get(0)?.as_f64()?, b.get(1)?.as_u64()?)))
        .collect();
    if bars.iter().all(|b| b.1 == 0) {
        return None;
    }
    let top = bars.iter().map(|b| b.1).max().unwrap_or(1) as f64 * 1.1;
    let title = format!("{} latency", name.replace('_', " "));
    let mut svg = String::new();
    let drawn = (|| -> Result<(), Box<dyn std::error::Error + '_>> {
        let root = SVGBackend::with_string(&mut svg, (520, 300)).into_drawing_area();
        root.fill(&WHITE)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 16))
            .margin(10)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(0f64..bars.len() as f64, 0f64..top)?;
        let labels: Vec<String> = bars.iter().map(|b| format!("{}", b.0)).collect();
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(bars.len().min(12))
            .x_label_formatter(&|x| {
                labels
                    .get(x.floor() as usize)
                    .map(|l| format!("<{l}"))
                    .unwrap_or_default()
            })
            .x_desc("ms")
            .y_desc("samples")
            .draw()?;
        chart.draw_series(bars.iter().enumerate().map(|(i, b)| {
            Rectangle::new(
                [(i as f64 + 0.1, 0.0), (i as f64 + 0.9, b.1 as f64)],
                BLUE.filled(),
            )
        }))?;
        root.present()?;
        Ok(())
    })();
    drawn.ok()?;
    Some(svg)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn run(v: Value) -> Run {
        match v {
            Value::Object(m) => m,
            _ => unreachable!("an object"),
        }
    }

    #[test]
    fn a_scenario_on_both_systems_is_compared_figure_by_figure_the_last_run_of_each() {
        let runs = vec![
            run(
                json!({"scenario": "kv", "target": "latchkey", "ops_per_s": 100.0, "latency_p99_ms": 9.0}),
            ),
            run(
                json!({"scenario": "kv", "target": "latchkey", "ops_per_s": 300.0, "latency_p99_ms": 4.0, "keys": 5, "latency_max_ms": 2.0}),
            ),
            run(
                json!({"scenario": "kv", "target": "etcd", "ops_per_s": 200.0, "latency_p99_ms": 8.0, "keys": 5}),
            ),
            run(json!({"scenario": "locks", "target": "latchkey", "acquisitions_per_s": 5.0})),
        ];
        let r = comparisons(&runs);
        // locks ran on latchkey only; keys is a setting, max a tail.
        assert_eq!(r.len(), 2, "{r:?}");
        let ops = r
            .iter()
            .find(|x| x.figure == "ops_per_s")
            .expect("ops_per_s");
        assert_eq!(
            (ops.latchkey, ops.etcd, ops.ratio, ops.latchkey_ahead),
            (300.0, 200.0, 1.5, true)
        );
        let p99 = r
            .iter()
            .find(|x| x.figure == "latency_p99_ms")
            .expect("p99");
        assert_eq!((p99.ratio, p99.latchkey_ahead), (0.5, true));
    }

    #[test]
    fn workloads_of_one_scenario_are_compared_apart() {
        let kv = |workload: &str, target: &str, rate: f64| {
            run(
                json!({"scenario": "kv", "workload": workload, "target": target, "ops_per_s": rate}),
            )
        };
        let runs = vec![
            kv("put", "latchkey", 10.0),
            kv("put", "etcd", 20.0),
            kv("serializable-range", "latchkey", 90.0),
            kv("serializable-range", "etcd", 30.0),
        ];
        let r = comparisons(&runs);
        let ratio = |w: &str| r.iter().find(|x| x.scenario == w).map(|x| x.ratio);
        assert_eq!(r.len(), 2, "{r:?}");
        assert_eq!(ratio("put"), Some(0.5));
        assert_eq!(ratio("serializable-range"), Some(3.0));
    }

    #[test]
    fn the_page_has_a_plot_per_series_and_histogram_and_escapes_text() {
        let runs = vec![run(json!({
            "scenario": "kv", "target": "latchkey", "first_error": "<refused>",
            "safety_counters": ["stale_reads"], "stale_reads": 0,
            "series": [{"t_s": 1.0, "p50_ms": 1.0, "p99_ms": 2.0}, {"t_s": 2.0, "p50_ms": 1.5, "p99_ms": 3.0}],
            "latency_histogram": [[0.1, 0], [0.2, 5], [0.4, 9]],
            "put_histogram": [[0.1, 0]],
        }))];
        let html = page(&runs);
        // One line plot, one histogram (an empty one is left out).
        assert_eq!(html.matches("<svg").count(), 2, "{html}");
        assert!(html.contains("latency over time"));
        assert!(html.contains("&lt;refused&gt;") && !html.contains("<refused>"));
        assert!(html.contains("stale_reads = 0"));
    }

    #[test]
    fn a_line_that_is_not_a_result_is_refused_with_its_place() {
        let dir = tempfile::tempdir().expect("a directory");
        let file = dir.path().join("r.jsonl");
        std::fs::write(&file, "{\"scenario\": \"kv\"}\n{\"nothing\": 1}\n").expect("write");
        let e = read_runs(&[file]).expect_err("refused");
        assert!(
            e.ends_with("r.jsonl:2: not a scenario's result (no \"scenario\")"),
            "{e}"
        );
    }
}
