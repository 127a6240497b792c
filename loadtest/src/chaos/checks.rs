//! The invariants checked after heal, each a function from what was
//! recorded to the violations found (empty: it held).

use super::workload::{Entry, Seen};
use latchkey_testkit::linearizability::{Answer, Call};
use std::collections::{BTreeMap, HashMap};

/// Revisions never go backwards in any client's view, and a write a
/// client saw succeed has a revision above everything it saw before.
pub fn revisions_per_client(entries: &[Entry]) -> Vec<String> {
    let mut by_client: BTreeMap<usize, Vec<&Entry>> = BTreeMap::new();
    for e in entries {
        by_client.entry(e.client).or_default().push(e);
    }
    let mut violations = Vec::new();
    for (client, mut ops) in by_client {
        ops.sort_by_key(|e| e.op.invoke);
        let mut highest = 0i64;
        for e in ops {
            let Some(rev) = e.revision else { continue };
            let wrote = matches!(e.op.answer, Answer::Done | Answer::Cas(true));
            if rev < highest || (wrote && rev == highest) {
                violations.push(format!(
                    "client {client} ({}) saw revision {rev} after {highest} ({:?} of {} at {} µs)",
                    e.via, e.op.call, e.op.key, e.op.invoke
                ));
            }
            highest = highest.max(rev);
        }
    }
    violations
}

/// Lock handoffs through the proxy while one follower is cut off from its
/// peers stay quick (proxy review P2): from a holder's last accepted write
/// (it then releases) to the next holder's first, at most `bound_us`, for
/// every handoff that begins inside one of `windows` (start and end, µs).
/// `writes` are the accepted writes in the order decided: (µs, token).
pub fn slow_handoffs(writes: &[(u64, i64)], windows: &[(u64, u64)], bound_us: u64) -> Vec<String> {
    let token_at = |at: u64| writes.iter().find(|w| w.0 == at).map_or(0, |w| w.1);
    handoffs_within(writes, windows)
        .filter(|(from, to)| to - from > bound_us)
        .map(|(from, to)| {
            format!(
                "a lock handoff with a follower cut off took {} ms (token {} last wrote at \
                 {:.3}s, token {} first at {:.3}s; at most {} ms)",
                (to - from) / 1000,
                token_at(from),
                from as f64 / 1e6,
                token_at(to),
                to as f64 / 1e6,
                bound_us / 1000
            )
        })
        .collect()
}

/// The handoffs in `writes` (see [`slow_handoffs`]) that begin inside one
/// of `windows`: (the old holder's last write, the new one's first), µs.
pub fn handoffs_within<'a>(
    writes: &'a [(u64, i64)],
    windows: &'a [(u64, u64)],
) -> impl Iterator<Item = (u64, u64)> + 'a {
    writes
        .windows(2)
        .filter(|w| w[0].1 != w[1].1)
        .filter(|w| {
            windows
                .iter()
                .any(|&(from, to)| (from..=to).contains(&w[0].0))
        })
        .map(|w| (w[0].0, w[1].0.max(w[0].0)))
}

/// The watch through the proxy, resumed across every fault, saw exactly
/// the committed history a fresh watch on a member sees after heal; and
/// every write a client was told succeeded is in it, at its revision.
pub fn watch_history(watched: &[Seen], committed: &[Seen], entries: &[Entry]) -> Vec<String> {
    let mut violations = Vec::new();
    if let Some(i) =
        (0..watched.len().max(committed.len())).find(|i| watched.get(*i) != committed.get(*i))
    {
        violations.push(format!(
            "the resumed watch differs from the committed history at event {i}: \
             watched {:?}, committed {:?} ({} and {} events)",
            watched.get(i),
            committed.get(i),
            watched.len(),
            committed.len()
        ));
    }
    let at: HashMap<i64, &Seen> = committed.iter().map(|s| (s.revision, s)).collect();
    for e in entries {
        let (Some(rev), value) = (e.revision, written_value(e)) else {
            continue;
        };
        let Some(value) = value else { continue };
        match at.get(&rev) {
            Some(s) if s.key == e.op.key && s.value == value => {}
            other => violations.push(format!(
                "acknowledged write {}={value} at revision {rev} is not in the committed \
                 history (there: {other:?})",
                e.op.key
            )),
        }
    }
    violations
}

/// The watch through the proxy of a prefix that moved between cells,
/// where no fresh watch after heal can see the whole history (each cell
/// has its own stretch of it). Its events never go back in revision nor
/// repeat one; and each stretch it watched without a break, from its
/// start (`start`, or a read again after a move, [`Seen::reread`]) to its
/// last event, holds every write a client was told succeeded at a
/// revision in that stretch, at that revision (a gap in a watch resumed
/// on the new cell is a lost event). A prefix's revisions rise across a
/// move (the new cell continues above the old one's), so one order holds
/// for the whole run.
pub fn watch_across_moves(watched: &[Seen], start: i64, entries: &[Entry]) -> Vec<String> {
    let mut violations = Vec::new();
    let mut stretches: Vec<(i64, i64)> = Vec::new();
    let mut from = start;
    let mut last = start - 1;
    // The lowest revision the next event may carry.
    let mut lowest = start;
    let mut at: HashMap<(i64, &str), &Seen> = HashMap::new();
    for s in watched {
        let back = if s.is_reread() {
            s.revision < last
        } else {
            s.revision < lowest
        };
        if back {
            violations.push(format!(
                "the watch through the proxy went back from revision {last} to {} ({s:?})",
                s.revision
            ));
        }
        if s.is_reread() {
            stretches.push((from, last));
            from = s.revision + 1;
            last = s.revision;
            lowest = s.revision + 1;
            continue;
        }
        if at.insert((s.revision, &s.key), s).is_some() {
            violations.push(format!("the watch through the proxy repeated {s:?}"));
        }
        last = s.revision;
        lowest = s.revision;
    }
    stretches.push((from, last));
    for e in entries {
        let (Some(rev), Some(value)) = (e.revision, written_value(e)) else {
            continue;
        };
        if !stretches.iter().any(|(a, b)| (*a..=*b).contains(&rev)) {
            continue;
        }
        match at.get(&(rev, e.op.key.as_str())) {
            Some(s) if s.value == value && !s.delete => {}
            other => violations.push(format!(
                "acknowledged write {}={value} at revision {rev} is missing from the watch \
                 through the proxy, which watched that revision without a break (there: \
                 {other:?})",
                e.op.key
            )),
        }
    }
    violations
}

/// Every client write puts a value no other write puts: one that appears
/// twice in the committed history took effect twice (a write sent again
/// after an ambiguous failure).
pub fn writes_at_most_once(committed: &[Seen]) -> Vec<String> {
    let mut at: HashMap<(&str, &str), Vec<i64>> = HashMap::new();
    for s in committed.iter().filter(|s| !s.delete) {
        at.entry((&s.key, &s.value)).or_default().push(s.revision);
    }
    let mut twice: Vec<String> = at
        .into_iter()
        .filter(|(_, revs)| revs.len() > 1)
        .map(|((key, value), revs)| {
            format!(
                "the write {key}={value} took effect {} times (revisions {revs:?})",
                revs.len()
            )
        })
        .collect();
    twice.sort();
    twice
}

/// The value an entry's acknowledged write put, if it wrote.
pub fn written_value(e: &Entry) -> Option<&str> {
    match (&e.op.call, &e.op.answer) {
        (Call::Write(v), Answer::Done) => Some(v),
        (Call::Cas { to, .. }, Answer::Cas(true)) => Some(to),
        _ => None,
    }
}

/// The longest stretch without a successful write after a fault that
/// began at `at` and was healed by `until`: the gaps between successive
/// successful writes (completion times in order, microseconds on the
/// recorder's clock) from `at` up to the first write after `until`, or up
/// to `end` (the end of the run) if writes never came back.
pub fn longest_outage(writes: &[u64], at: u64, until: u64, end: u64) -> u64 {
    let mut last = at;
    let mut longest = 0;
    for &t in writes.iter().filter(|t| **t > at) {
        longest = longest.max(t - last);
        last = t;
        if t > until {
            return longest;
        }
    }
    longest.max(end.saturating_sub(last))
}

#[cfg(test)]
mod tests {
    use super::*;
    use latchkey_testkit::linearizability::Operation;

    fn entry(client: usize, invoke: u64, call: Call, answer: Answer, rev: i64) -> Entry {
        Entry {
            client,
            via: "proxy".into(),
            op: Operation {
                key: "k".into(),
                call,
                answer,
                invoke,
                complete: invoke + 1,
            },
            revision: Some(rev),
            serializable: false,
        }
    }

    #[test]
    fn a_slow_handoff_that_begins_while_a_follower_is_cut_off_is_a_violation() {
        let s = 1_000_000;
        let writes = [
            (s, 5),
            (s + 30_000, 5),
            (2 * s, 9), // 0.97 s: quick enough
            (3 * s, 9),
            (6 * s, 12),  // 3 s
            (20 * s, 15), // 14 s, but outside the window
        ];
        let window = [(s / 2, 5 * s)];
        let found = slow_handoffs(&writes, &window, 2 * s);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].contains("took 3000 ms"), "{found:?}");
    }

    #[test]
    fn a_client_seeing_an_older_revision_or_a_write_at_a_seen_one_is_a_violation() {
        let ok = [
            entry(1, 1, Call::Read, Answer::Read(None), 5),
            entry(1, 2, Call::Write("a".into()), Answer::Done, 6),
            entry(1, 3, Call::Read, Answer::Read(Some("a".into())), 6),
            entry(2, 1, Call::Read, Answer::Read(None), 3),
        ];
        assert!(revisions_per_client(&ok).is_empty());
        let mut back = ok.to_vec();
        back.push(entry(1, 4, Call::Read, Answer::Read(None), 5));
        assert_eq!(revisions_per_client(&back).len(), 1);
        let mut same = ok.to_vec();
        same.push(entry(1, 4, Call::Write("b".into()), Answer::Done, 6));
        assert_eq!(revisions_per_client(&same).len(), 1);
    }

    fn seen(rev: i64, value: &str) -> Seen {
        Seen {
            key: "k".into(),
            value: value.into(),
            revision: rev,
            delete: false,
        }
    }

    #[test]
    fn a_missed_event_or_an_acknowledged_write_missing_from_history_is_a_violation() {
        let committed = [seen(6, "a"), seen(7, "b")];
        let acked = [entry(1, 2, Call::Write("a".into()), Answer::Done, 6)];
        assert!(watch_history(&committed, &committed, &acked).is_empty());
        assert_eq!(watch_history(&committed[..1], &committed, &acked).len(), 1);
        let lost = [entry(1, 2, Call::Write("c".into()), Answer::Done, 8)];
        assert_eq!(watch_history(&committed, &committed, &lost).len(), 1);
    }

    fn seen_key(rev: i64, key: &str, value: &str) -> Seen {
        Seen {
            key: key.into(),
            value: value.into(),
            revision: rev,
            delete: false,
        }
    }

    #[test]
    fn a_watch_across_moves_checks_each_unbroken_stretch_and_its_order() {
        let acked = |v: &str, rev| entry(1, 2, Call::Write(v.into()), Answer::Done, rev);
        // Watched 5..=6 in one cell, read again at 20 in the other, then
        // 21..: the write at 9 fell between and is the re-read's to show.
        let watched = [seen(5, "a"), seen(6, "b"), Seen::reread(20), seen(21, "c")];
        let ok = [acked("a", 5), acked("b", 6), acked("z", 9), acked("c", 21)];
        assert!(watch_across_moves(&watched, 5, &ok).is_empty());
        // A write acknowledged inside a stretch but not seen is a gap.
        let lost = [acked("y", 6)];
        assert_eq!(watch_across_moves(&watched, 5, &lost).len(), 1);
        let gap = [seen(5, "a"), seen(7, "c")];
        assert_eq!(watch_across_moves(&gap, 5, &[acked("b", 6)]).len(), 1);
        // Going back, or the same event twice, is a violation.
        let back = [seen(6, "b"), Seen::reread(20), seen(19, "c")];
        assert_eq!(watch_across_moves(&back, 5, &[]).len(), 1);
        let twice = [seen(6, "b"), seen(6, "b")];
        assert_eq!(watch_across_moves(&twice, 5, &[]).len(), 1);
        let two_keys = [seen_key(6, "k", "b"), seen_key(6, "j", "b")];
        assert!(watch_across_moves(&two_keys, 5, &[]).is_empty());
    }

    #[test]
    fn a_value_put_twice_is_a_write_that_took_effect_twice() {
        let once = [seen(6, "a"), seen(7, "b")];
        assert!(writes_at_most_once(&once).is_empty());
        let twice = [seen(6, "a"), seen(7, "b"), seen(9, "a")];
        assert_eq!(writes_at_most_once(&twice).len(), 1);
    }

    #[test]
    fn the_outage_is_the_longest_gap_between_successful_writes_from_the_fault_on() {
        let writes = [10, 20, 100, 105, 300];
        assert_eq!(longest_outage(&writes, 15, 200, 400), 195, "105 -> 300");
        assert_eq!(longest_outage(&writes, 0, 50, 400), 80, "20 -> 100");
        assert_eq!(longest_outage(&writes, 101, 150, 400), 195, "105 -> 300");
        assert_eq!(longest_outage(&[], 0, 50, 60), 60, "writes never came back");
    }
}
