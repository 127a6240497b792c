//! The metrics catalog (STYLE habit 15): what a [`Metric`] is, the one
//! [`describe_all`] that gives a catalog's metrics their HELP text and
//! unit, and the metrics the shared crate's own code records (the lock and
//! election recipes in [`crate::lock`], which run in the cell and in the
//! proxy alike). The cell and the proxy keep their catalogs in their own
//! `metrics_catalog` modules, and each describes this one too.
//!
//! A call site names a metric by its constant: `metrics::counter!(X.name)`.

use metrics::Unit;

/// The Prometheus type a metric is recorded as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

/// One metric, named once: its exported name, type, unit and HELP text.
#[derive(Clone, Copy, Debug)]
pub struct Metric {
    pub name: &'static str,
    pub kind: Kind,
    pub unit: Unit,
    pub help: &'static str,
}

pub const LOCK_WAKEUPS: Metric = Metric {
    name: "latchkey_lock_wakeups_total",
    kind: Kind::Counter,
    unit: Unit::Count,
    help: "Times a contender waiting in a lock or election queue was woken by a change to its predecessor's key or its own, each followed by a read of the queue.",
};

pub const LOCK_DELAYS: Metric = Metric {
    name: "latchkey_lock_delays_total",
    kind: Kind::Counter,
    unit: Unit::Count,
    help: "Lock-delays a contender waited out before taking a lock, owed because the previous holder's session ended without releasing it.",
};

pub const TLS_RELOADS: Metric = Metric {
    name: "latchkey_tls_reloads_total",
    kind: Kind::Counter,
    unit: Unit::Count,
    help: "Certificate and key files of a listener or a client side found changed on disk and loaded, by listener and outcome (ok, or failed: the previous certificate stays in use and the log says why).",
};

pub const TLS_HANDSHAKE_FAILURES: Metric = Metric {
    name: "latchkey_tls_handshake_failures_total",
    kind: Kind::Counter,
    unit: Unit::Count,
    help: "Connections to a TLS listener closed before a TLS session was set up (plain text, a certificate the listener does not trust, none where one is required, or no handshake within its timeout), by listener.",
};

/// Every metric the shared crate records.
pub const ALL: &[Metric] = &[
    LOCK_WAKEUPS,
    LOCK_DELAYS,
    TLS_RELOADS,
    TLS_HANDSHAKE_FAILURES,
];

/// Describes each metric of `catalog` to the process's recorder (a no-op
/// without one; describing a metric again changes nothing).
pub fn describe_all(catalog: &[Metric]) {
    for m in catalog {
        match m.kind {
            Kind::Counter => metrics::describe_counter!(m.name, m.unit, m.help),
            Kind::Gauge => metrics::describe_gauge!(m.name, m.unit, m.help),
            Kind::Histogram => metrics::describe_histogram!(m.name, m.unit, m.help),
        }
    }
}

/// Describes the shared crate's metrics.
pub fn describe() {
    describe_all(ALL);
}

/// Checks of a catalog that every crate's catalog tests run.
#[doc(hidden)]
pub mod checks {
    use super::{Kind, Metric};
    use metrics::Unit;
    use std::collections::BTreeSet;
    use std::path::{Path, PathBuf};

    /// Crate names, which appear in log filters and targets: not metrics.
    const NOT_METRICS: &[&str] = &[
        "latchkey_shared",
        "latchkey_cell",
        "latchkey_proxy",
        "latchkey_testkit",
    ];

    /// Panics, naming the entry, unless every entry has a help text, a
    /// name unique in `catalog` that follows the naming rules (STYLE:
    /// `latchkey_...`, counters `_total`, seconds `_seconds`, bytes
    /// `_bytes`).
    pub fn well_formed(catalog: &[Metric]) {
        let mut seen = BTreeSet::new();
        for m in catalog {
            assert!(!m.help.trim().is_empty(), "{} has no help text", m.name);
            assert!(seen.insert(m.name), "{} is in the catalog twice", m.name);
            assert!(
                m.name.starts_with("latchkey_")
                    && m.name
                        .bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'),
                "{} is not a latchkey_ metric name",
                m.name
            );
            assert_eq!(
                m.kind == Kind::Counter,
                m.name.ends_with("_total"),
                "{}: counters, and only counters, end in _total",
                m.name
            );
            assert_eq!(
                m.unit == Unit::Seconds,
                m.name.ends_with("_seconds"),
                "{}: a name ends in _seconds exactly when its unit is seconds",
                m.name
            );
            assert_eq!(
                m.unit == Unit::Bytes,
                m.name.ends_with("_bytes"),
                "{}: a name ends in _bytes exactly when its unit is bytes",
                m.name
            );
        }
    }

    /// Every `.rs` file under `dir`, recursively.
    fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
        let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        for entry in entries {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                rust_files(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }

    /// The string literals in `source` that look like a metric name: a
    /// whole literal `"latchkey_` + lowercase letters, digits and `_`.
    pub fn metric_literals(source: &str) -> Vec<&str> {
        let mut found = Vec::new();
        let mut rest = source;
        while let Some(at) = rest.find("\"latchkey_") {
            let after = &rest[at + 1..];
            let len = after
                .bytes()
                .take_while(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'_')
                .count();
            let name = &after[..len];
            if after[len..].starts_with('"') && !NOT_METRICS.contains(&name) {
                found.push(name);
            }
            rest = &after[len..];
        }
        found
    }

    /// Panics, naming each, if a file under `src` other than its
    /// `metrics_catalog.rs` spells a metric name as a string literal:
    /// call sites use the catalog's constants.
    pub fn no_literal_names_outside_the_catalog(src: &Path) {
        let mut files = Vec::new();
        rust_files(src, &mut files);
        let mut offenders = Vec::new();
        for file in files {
            if file.file_name().is_some_and(|n| n == "metrics_catalog.rs") {
                continue;
            }
            let text = std::fs::read_to_string(&file)
                .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            for name in metric_literals(&text) {
                offenders.push(format!("{}: \"{name}\"", file.display()));
            }
        }
        assert!(
            offenders.is_empty(),
            "metric names spelled outside the catalog (use its constants):\n{}",
            offenders.join("\n")
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_catalog_is_well_formed() {
        checks::well_formed(ALL);
    }

    #[test]
    fn the_crate_spells_no_metric_name_outside_the_catalog() {
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        checks::no_literal_names_outside_the_catalog(&src);
    }

    #[test]
    fn only_whole_metric_name_literals_are_found() {
        let source = concat!(
            "counter!(\"latchkey_a_total\"); \"latchkey_cell=debug\" ",
            "\"latchkey_cell::cell\" \"latchkey_cell\" \"LATCHKEY_LOG\" ",
            "gauge!(\n    \"latchkey_b\",\n)"
        );
        assert_eq!(
            checks::metric_literals(source),
            vec!["latchkey_a_total", "latchkey_b"]
        );
    }

    #[test]
    fn describing_without_a_recorder_does_nothing() {
        describe();
        describe();
    }
}
