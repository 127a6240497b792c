//! A linearizability checker for key-value histories: Wing and Gong's
//! search for a legal sequential order that respects real time, with
//! Lowe's memo of the (operations done, state) pairs already explored, run
//! on each key alone (P-compositionality: single-key operations on
//! independent registers make a linearizable history exactly when every
//! key's sub-history is).
//!
//! Operations whose outcome is unknown (the client saw no answer) may have
//! taken effect at any time after their invocation, or never: they get no
//! completion time and their answer constrains nothing. Reads with an
//! unknown outcome change nothing and are dropped; operations that surely
//! failed (nothing happened) are dropped too.

use std::collections::HashSet;

/// What a client asked of one key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Call {
    Read,
    Write(String),
    Delete,
    /// Write `to` if the value is `from` (`None`: the key is absent).
    Cas {
        from: Option<String>,
        to: String,
    },
}

/// What the client was answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// A read's value (`None`: absent).
    Read(Option<String>),
    /// A write or delete took effect.
    Done,
    /// Whether a compare-and-set wrote.
    Cas(bool),
    /// Nothing happened (the error said so).
    Failed,
    /// No answer: it may or may not have happened.
    Unknown,
}

/// One operation of a history: invoked and answered at these times (any
/// monotonic clock shared by the clients; `complete` is ignored for an
/// unknown outcome).
#[derive(Debug, Clone)]
pub struct Operation {
    pub key: String,
    pub call: Call,
    pub answer: Answer,
    pub invoke: u64,
    pub complete: u64,
}

/// The checker's finding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Every key's operations have a legal order; `operations` were
    /// checked (failed ones and unknown reads excluded).
    Linearizable { operations: usize },
    /// No legal order exists for this key's operations.
    NotLinearizable { key: String },
}

/// Checks a whole history, key by key.
pub fn check(history: &[Operation]) -> Verdict {
    let mut keys: Vec<&str> = history.iter().map(|o| o.key.as_str()).collect();
    keys.sort_unstable();
    keys.dedup();
    let mut operations = 0;
    for key in keys {
        let ops: Vec<Op> = history
            .iter()
            .filter(|o| o.key == key)
            .filter_map(Op::of)
            .collect();
        operations += ops.len();
        if !Search::new(&ops).run() {
            return Verdict::NotLinearizable {
                key: key.to_string(),
            };
        }
    }
    Verdict::Linearizable { operations }
}

/// An operation as the search sees it.
#[derive(Debug)]
struct Op {
    call: Call,
    /// `None`: unknown, anything goes.
    answer: Option<Answer>,
    invoke: u64,
    /// `u64::MAX` for an unknown outcome.
    complete: u64,
}

impl Op {
    fn of(o: &Operation) -> Option<Op> {
        match (&o.call, &o.answer) {
            (_, Answer::Failed) | (Call::Read, Answer::Unknown) => None,
            (_, Answer::Unknown) => Some(Op {
                call: o.call.clone(),
                answer: None,
                invoke: o.invoke,
                complete: u64::MAX,
            }),
            (_, answer) => Some(Op {
                call: o.call.clone(),
                answer: Some(answer.clone()),
                invoke: o.invoke,
                complete: o.complete.max(o.invoke),
            }),
        }
    }

    /// The state after this operation from `state`, if its answer fits.
    fn apply(&self, state: &Option<String>) -> Option<Option<String>> {
        let fits = |expected: Answer| self.answer.as_ref().is_none_or(|a| *a == expected);
        match &self.call {
            Call::Read => fits(Answer::Read(state.clone())).then(|| state.clone()),
            Call::Write(v) => fits(Answer::Done).then(|| Some(v.clone())),
            Call::Delete => fits(Answer::Done).then_some(None),
            Call::Cas { from, to } => {
                let wrote = state == from;
                fits(Answer::Cas(wrote)).then(|| {
                    if wrote {
                        Some(to.clone())
                    } else {
                        state.clone()
                    }
                })
            }
        }
    }
}

/// The search over one key's operations.
struct Search<'a> {
    ops: &'a [Op],
    /// (operations done, state) pairs from which no order was found.
    dead_ends: HashSet<(Vec<u64>, Option<String>)>,
}

impl<'a> Search<'a> {
    fn new(ops: &'a [Op]) -> Self {
        Search {
            ops,
            dead_ends: HashSet::new(),
        }
    }

    fn run(&mut self) -> bool {
        let done = vec![0u64; self.ops.len().div_ceil(64)];
        self.from(done, 0, None)
    }

    /// Whether the operations not in `done` (`count` of them are done) can
    /// follow in a legal order from `state`. Depth-first: one frame per
    /// operation placed, so the depth is the key's operation count.
    fn from(&mut self, mut done: Vec<u64>, count: usize, state: Option<String>) -> bool {
        if count == self.ops.len() {
            return true;
        }
        let is_done = |done: &[u64], i: usize| done[i / 64] & (1 << (i % 64)) != 0;
        // An operation may go next only if no pending one completed
        // before it was invoked.
        let horizon = (0..self.ops.len())
            .filter(|&i| !is_done(&done, i))
            .map(|i| self.ops[i].complete)
            .min()
            .unwrap_or(u64::MAX);
        for i in 0..self.ops.len() {
            if is_done(&done, i) || self.ops[i].invoke > horizon {
                continue;
            }
            let Some(next) = self.ops[i].apply(&state) else {
                continue;
            };
            done[i / 64] |= 1 << (i % 64);
            let seen = !self.dead_ends.insert((done.clone(), next.clone()));
            if !seen && self.from(done.clone(), count + 1, next) {
                return true;
            }
            done[i / 64] &= !(1 << (i % 64));
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(call: Call, answer: Answer, invoke: u64, complete: u64) -> Operation {
        Operation {
            key: "k".into(),
            call,
            answer,
            invoke,
            complete,
        }
    }

    fn w(v: &str, invoke: u64, complete: u64) -> Operation {
        op(Call::Write(v.into()), Answer::Done, invoke, complete)
    }

    fn r(v: Option<&str>, invoke: u64, complete: u64) -> Operation {
        op(
            Call::Read,
            Answer::Read(v.map(str::to_string)),
            invoke,
            complete,
        )
    }

    fn cas(from: &str, to: &str, wrote: bool, invoke: u64, complete: u64) -> Operation {
        op(
            Call::Cas {
                from: Some(from.into()),
                to: to.into(),
            },
            Answer::Cas(wrote),
            invoke,
            complete,
        )
    }

    fn unknown(call: Call, invoke: u64) -> Operation {
        op(call, Answer::Unknown, invoke, 0)
    }

    fn linearizable(history: &[Operation]) -> bool {
        matches!(check(history), Verdict::Linearizable { .. })
    }

    #[test]
    fn a_stale_read_is_caught() {
        let history = [w("1", 0, 1), w("2", 2, 3), r(Some("1"), 4, 5)];
        assert_eq!(
            check(&history),
            Verdict::NotLinearizable { key: "k".into() }
        );
    }

    #[test]
    fn a_lost_write_is_caught() {
        assert!(!linearizable(&[w("1", 0, 1), r(None, 2, 3)]));
        assert!(!linearizable(&[
            w("1", 0, 1),
            w("2", 2, 3),
            r(Some("1"), 10, 11)
        ]));
    }

    #[test]
    fn a_read_of_a_value_never_written_is_caught() {
        assert!(!linearizable(&[w("1", 0, 1), r(Some("9"), 2, 3)]));
    }

    #[test]
    fn a_compare_and_set_that_succeeded_twice_is_caught() {
        let history = [
            w("0", 0, 1),
            cas("0", "1", true, 2, 5),
            cas("0", "2", true, 3, 6),
        ];
        assert!(!linearizable(&history));
        // One of them losing is fine, in either order.
        let one_lost = [
            w("0", 0, 1),
            cas("0", "1", true, 2, 5),
            cas("0", "2", false, 3, 6),
        ];
        assert!(linearizable(&one_lost));
        let other_lost = [
            w("0", 0, 1),
            cas("0", "1", false, 2, 5),
            cas("0", "2", true, 3, 6),
        ];
        assert!(linearizable(&other_lost));
    }

    #[test]
    fn concurrent_operations_may_take_effect_in_either_order() {
        // A read concurrent with a write sees the old or the new value.
        for seen in [Some("1"), Some("2")] {
            assert!(linearizable(&[w("1", 0, 1), w("2", 2, 6), r(seen, 3, 5)]));
        }
        // But two reads in real-time order cannot see new then old.
        let flicker = [
            w("1", 0, 1),
            w("2", 2, 10),
            r(Some("2"), 3, 4),
            r(Some("1"), 5, 6),
        ];
        assert!(!linearizable(&flicker));
        assert!(linearizable(&[
            r(None, 0, 1),
            op(Call::Delete, Answer::Done, 2, 3)
        ]));
    }

    #[test]
    fn an_unknown_write_may_take_effect_late_or_never_but_not_be_undone() {
        let base = [w("1", 0, 1), unknown(Call::Write("2".into()), 2)];
        // Seen long after, or never seen: both legal.
        let mut late = base.to_vec();
        late.push(r(Some("2"), 100, 101));
        assert!(linearizable(&late));
        let mut never = base.to_vec();
        never.push(r(Some("1"), 100, 101));
        assert!(linearizable(&never));
        // Seen, then gone again with no write to undo it: not legal.
        let mut undone = base.to_vec();
        undone.extend([r(Some("2"), 3, 4), r(Some("1"), 5, 6)]);
        assert!(!linearizable(&undone));
        // It cannot take effect before it was invoked.
        let early = [
            w("1", 0, 1),
            r(Some("2"), 2, 3),
            unknown(Call::Write("2".into()), 4),
        ];
        assert!(!linearizable(&early));
    }

    #[test]
    fn unknown_compare_and_sets_and_failed_operations() {
        // An unknown CAS may have written.
        let history = [
            w("0", 0, 1),
            unknown(
                Call::Cas {
                    from: Some("0".into()),
                    to: "1".into(),
                },
                2,
            ),
            r(Some("1"), 10, 11),
        ];
        assert!(linearizable(&history));
        // A failed write never happened, so its value cannot be read.
        let failed = [
            w("0", 0, 1),
            op(Call::Write("5".into()), Answer::Failed, 2, 3),
            r(Some("5"), 4, 5),
        ];
        assert!(!linearizable(&failed));
        // An unknown read constrains nothing.
        assert!(linearizable(&[
            w("0", 0, 1),
            unknown(Call::Read, 2),
            r(Some("0"), 3, 4)
        ]));
    }

    #[test]
    fn keys_are_checked_apart_and_the_count_excludes_dropped_operations() {
        let mut history = vec![w("1", 0, 10), r(Some("1"), 11, 12), unknown(Call::Read, 13)];
        let mut other = vec![w("a", 0, 1), r(Some("a"), 2, 3)];
        for o in &mut other {
            o.key = "other".into();
        }
        history.extend(other.clone());
        assert_eq!(check(&history), Verdict::Linearizable { operations: 4 });
        other.push(Operation {
            key: "other".into(),
            ..r(None, 4, 5)
        });
        history.extend(other);
        assert_eq!(
            check(&history),
            Verdict::NotLinearizable {
                key: "other".into()
            }
        );
    }

    #[test]
    fn a_long_overlapping_history_is_accepted() {
        // 200 writes and reads of one key, each write overlapping the next
        // three operations: the memo keeps the search small.
        let mut history = Vec::new();
        let mut last = None;
        for i in 0..200u64 {
            let t = i * 10;
            if i % 2 == 0 {
                history.push(w(&i.to_string(), t, t + 35));
                last = Some(i.to_string());
            } else {
                history.push(r(last.as_deref(), t + 36, t + 37));
            }
        }
        assert!(linearizable(&history));
        // The last read changed to a value never written: caught.
        let last = history.len() - 1;
        history[last].answer = Answer::Read(Some("never".into()));
        assert!(!linearizable(&history));
    }
}
