//! The verdict of a run: a human summary, one JSON line, and, when
//! something was violated, the history (`history.json`) and a picture of
//! it (`history.html`: every operation on the failing key, or on every
//! key, as a bar from invocation to answer per client, with the faults
//! shaded) in the output directory.

use super::workload::Entry;
use super::Findings;
use crate::html::escape;
use latchkey_testkit::linearizability::Answer;
use std::fmt::Write as _;
use std::path::Path;
use std::process::ExitCode;

pub fn finish(out: &Path, keep: bool, f: &Findings, entries: &[Entry]) -> ExitCode {
    let verdict = match f.linearizable {
        Some(true) => "linearizable",
        Some(false) => "NOT linearizable",
        None => "undecided",
    };
    println!("chaos: seed {}", f.seed);
    println!(
        "chaos: {} operations checked, {} faults injected ({} skipped), {} lock grants, {} stale \
         fenced writes refused",
        f.operations,
        f.faults.len(),
        f.skipped,
        f.lock_grants,
        f.stale_refused
    );
    println!(
        "chaos: {:<20} {:>6} {:>18}",
        "fault", "count", "longest outage ms"
    );
    for (kind, count, gap) in &f.outages {
        println!(
            "chaos: {:<20} {:>6} {:>18}",
            kind.name(),
            count,
            gap.as_millis()
        );
    }
    let c = &f.coverage;
    println!(
        "chaos: proxy invariants checked on {} serializable reads, {} keep-alives confirmed by \
         the proxy, {} lock handoffs with a follower cut off (slowest {} ms)",
        c.serializable_reads,
        c.proxy_keep_alives,
        c.partition_handoffs,
        c.slowest_partition_handoff.as_millis()
    );
    let pauses = super::cells::pauses(&f.moves);
    let pause_at = |q: f64| -> u64 {
        if pauses.is_empty() {
            return 0;
        }
        let i = ((pauses.len() as f64 * q).ceil() as usize).clamp(1, pauses.len()) - 1;
        pauses[i].as_millis() as u64
    };
    if !f.moves.is_empty() {
        println!(
            "chaos: {} moves of the prefix asked for, {} went through (the rest were undone); \
             write pause ms p50 {} p99 {} max {}; {} operations refused by a cell that did not \
             own their key",
            f.moves.len(),
            pauses.len(),
            pause_at(0.5),
            pause_at(0.99),
            pause_at(1.0),
            f.refused
        );
    }
    for v in &f.violations {
        println!("chaos: VIOLATION {v}");
    }
    let json = serde_json::json!({
        "seed": f.seed,
        "verdict": verdict,
        "operations": f.operations,
        "faults": f.faults.len(),
        "skipped": f.skipped,
        "violations": f.violations,
        "lock_grants": f.lock_grants,
        "stale_refused": f.stale_refused,
        "serializable_reads": c.serializable_reads,
        "proxy_keep_alives": c.proxy_keep_alives,
        "partition_handoffs": c.partition_handoffs,
        "moves": f.moves.len(),
        "moves_through": pauses.len(),
        "move_pause_p99_ms": pause_at(0.99),
        "refused_wrong_cell": f.refused,
        "slowest_partition_handoff_ms": c.slowest_partition_handoff.as_millis() as u64,
        "outages_ms": f.outages.iter()
            .map(|(k, n, g)| (k.name().to_string(), serde_json::json!({"count": n, "longest": g.as_millis() as u64})))
            .collect::<serde_json::Map<_, _>>(),
    });
    println!("{json}");
    if f.violations.is_empty() {
        println!("chaos: verdict: {verdict}, 0 invariant violations");
        if keep {
            if let Err(e) = write_report(out, f, entries) {
                println!(
                    "chaos: could not write the report to {}: {e}",
                    out.display()
                );
            }
        }
        return ExitCode::SUCCESS;
    }
    match write_report(out, f, entries) {
        Ok(()) => println!(
            "chaos: verdict: {verdict}, {} violations; history and report in {} \
             (rerun with --seed {})",
            f.violations.len(),
            out.display(),
            f.seed
        ),
        Err(e) => println!(
            "chaos: could not write the report to {}: {e}",
            out.display()
        ),
    }
    ExitCode::from(1)
}

fn answer_text(a: &Answer) -> String {
    match a {
        Answer::Read(Some(v)) => format!("read {v}"),
        Answer::Read(None) => "read nothing".into(),
        Answer::Done => "ok".into(),
        Answer::Cas(ok) => format!("cas {ok}"),
        Answer::Failed => "failed".into(),
        Answer::Unknown => "unknown".into(),
    }
}

fn write_report(out: &Path, f: &Findings, entries: &[Entry]) -> std::io::Result<()> {
    std::fs::create_dir_all(out)?;
    let history: Vec<serde_json::Value> = entries
        .iter()
        .map(|e| {
            serde_json::json!({
                "client": e.client, "via": e.via, "key": e.op.key,
                "call": format!("{:?}", e.op.call), "answer": answer_text(&e.op.answer),
                "invoke_us": e.op.invoke, "complete_us": e.op.complete, "revision": e.revision,
            })
        })
        .collect();
    let faults: Vec<serde_json::Value> = f
        .faults
        .iter()
        .map(|d| serde_json::json!({"kind": d.kind.name(), "detail": d.detail, "at_us": d.at_us, "healed_us": d.healed_us}))
        .collect();
    std::fs::write(
        out.join("history.json"),
        serde_json::to_string_pretty(&serde_json::json!({
            "seed": f.seed, "violations": f.violations, "faults": faults, "operations": history,
        }))?,
    )?;
    std::fs::write(out.join("history.html"), html(f, entries))
}

/// One SVG row per client; a bar per operation on the shown key(s) from
/// invocation to answer (unknown answers run to the right edge).
fn html(f: &Findings, entries: &[Entry]) -> String {
    let shown: Vec<&Entry> = entries
        .iter()
        .filter(|e| f.bad_key.as_ref().is_none_or(|k| *k == e.op.key))
        .collect();
    let t0 = shown.iter().map(|e| e.op.invoke).min().unwrap_or(0);
    let t1 = shown
        .iter()
        .map(|e| e.op.complete.max(e.op.invoke))
        .max()
        .unwrap_or(1)
        .max(t0 + 1);
    let width = 1600.0;
    let x = |t: u64| (t.saturating_sub(t0)) as f64 / (t1 - t0) as f64 * width;
    let mut clients: Vec<usize> = shown.iter().map(|e| e.client).collect();
    clients.sort_unstable();
    clients.dedup();
    let row = |c: usize| clients.iter().position(|x| *x == c).unwrap_or(0) as f64 * 28.0 + 20.0;
    let height = clients.len() as f64 * 28.0 + 40.0;
    let mut svg = String::new();
    for d in &f.faults {
        let _ = write!(
            svg,
            "<rect x='{:.1}' y='0' width='{:.1}' height='{height}' fill='#fdd'><title>{}: {}</title></rect>",
            x(d.at_us),
            (x(d.healed_us) - x(d.at_us)).max(1.0),
            d.kind.name(),
            escape(&d.detail)
        );
    }
    for e in &shown {
        let end = if e.op.answer == Answer::Unknown {
            t1
        } else {
            e.op.complete
        };
        let colour = match e.op.answer {
            Answer::Unknown => "#bbb",
            Answer::Read(_) => "#69c",
            _ => "#6a6",
        };
        let _ = write!(
            svg,
            "<rect x='{:.1}' y='{:.1}' width='{:.1}' height='20' fill='{colour}' stroke='#333'>\
             <title>client {} via {}: {} {:?} -> {} ({}..{} µs, revision {:?})</title></rect>",
            x(e.op.invoke),
            row(e.client),
            (x(end) - x(e.op.invoke)).max(1.0),
            e.client,
            escape(&e.via),
            escape(&e.op.key),
            e.op.call,
            escape(&answer_text(&e.op.answer)),
            e.op.invoke,
            e.op.complete,
            e.revision
        );
    }
    let mut list = String::new();
    for v in &f.violations {
        let _ = write!(list, "<li>{}</li>", escape(v));
    }
    format!(
        "<!doctype html><meta charset='utf-8'><title>chaos seed {seed}</title>\
         <h1>chaos seed {seed}</h1><ul>{list}</ul>\
         <p>{what}: one row per client, a bar per operation from invocation to answer \
         (grey: unknown outcome), faults shaded red. Hover for details.</p>\
         <svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}'>{svg}</svg>",
        seed = f.seed,
        what = f
            .bad_key
            .as_ref()
            .map_or("every key".to_string(), |k| format!("key {}", escape(k))),
    )
}
