//! What one answer on an upstream Watch stream means for the shared watch
//! it names: [`read`] turns a `WatchResponse` into [`Answer`]s, grouping
//! its events by revision (one answer may carry several revisions, and a
//! revision's events always arrive together unless fragmenting was asked
//! for, which the proxy never asks).

use super::shared_watch::Revision;
use latchkey_shared::etcdpb::{PbEvent, PbWatchResponse};
use std::sync::Arc;
use tokio::time::Instant;

/// One thing an upstream answer says about the watch `watch_id`.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    /// The watch exists; it reports every revision after `revision`.
    Created {
        watch_id: i64,
        revision: i64,
    },
    /// Events, one entry per revision, in order.
    Revisions {
        watch_id: i64,
        revisions: Vec<Revision>,
    },
    /// Nothing changed in the range up to `revision` (a progress
    /// notification, or an answer to a WatchProgress request).
    Progress {
        watch_id: i64,
        revision: i64,
    },
    /// The member ended the watch: its start revision was compacted, or
    /// it was cancelled with `reason`.
    Compacted {
        watch_id: i64,
        compact_revision: i64,
    },
    Cancelled {
        watch_id: i64,
        reason: String,
    },
}

/// The answers in `resp`, received at `received`.
pub fn read(resp: PbWatchResponse, received: Instant) -> Vec<Answer> {
    let watch_id = resp.watch_id;
    let header_revision = resp.header.as_ref().map_or(0, |h| h.revision);
    // A create whose start was compacted away is answered created and
    // compacted at once: it is only compacted.
    if resp.compact_revision > 0 {
        return vec![Answer::Compacted {
            watch_id,
            compact_revision: resp.compact_revision,
        }];
    }
    let mut answers = Vec::new();
    if resp.created {
        answers.push(Answer::Created {
            watch_id,
            revision: header_revision,
        });
    }
    if resp.canceled {
        answers.push(Answer::Cancelled {
            watch_id,
            reason: resp.cancel_reason,
        });
        return answers;
    }
    if resp.events.is_empty() {
        if !resp.created {
            answers.push(Answer::Progress {
                watch_id,
                revision: header_revision,
            });
        }
        return answers;
    }
    answers.push(Answer::Revisions {
        watch_id,
        revisions: by_revision(resp.events, received),
    });
    answers
}

fn by_revision(events: Vec<PbEvent>, received: Instant) -> Vec<Revision> {
    let mut revisions: Vec<Revision> = Vec::new();
    let mut current: Vec<PbEvent> = Vec::new();
    let mut current_revision = None;
    for event in events {
        let revision = event.kv.as_ref().map_or(0, |kv| kv.mod_revision);
        if current_revision.is_some_and(|r| r != revision) {
            revisions.push(Revision {
                revision: current_revision.unwrap_or_default(),
                events: Arc::from(std::mem::take(&mut current)),
                received,
                herd: 1,
            });
        }
        current_revision = Some(revision);
        current.push(event);
    }
    if let Some(revision) = current_revision {
        revisions.push(Revision {
            revision,
            events: Arc::from(current),
            received,
            herd: 1,
        });
    }
    revisions
}

#[cfg(test)]
mod tests {
    use super::*;
    use latchkey_shared::etcdpb::{PbKeyValue, PbResponseHeader};

    fn event(key: &str, revision: i64) -> PbEvent {
        PbEvent {
            kv: Some(PbKeyValue {
                key: key.as_bytes().to_vec(),
                mod_revision: revision,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn answer(watch_id: i64, revision: i64) -> PbWatchResponse {
        PbWatchResponse {
            header: Some(PbResponseHeader {
                revision,
                ..Default::default()
            }),
            watch_id,
            ..Default::default()
        }
    }

    #[test]
    fn events_are_grouped_by_revision_in_order() {
        let now = Instant::now();
        let mut resp = answer(3, 9);
        resp.events = vec![event("a", 5), event("b", 5), event("a", 7), event("c", 9)];
        let [Answer::Revisions {
            watch_id,
            revisions,
        }] = &read(resp, now)[..]
        else {
            panic!("one Revisions answer");
        };
        assert_eq!(*watch_id, 3);
        let shape: Vec<(i64, usize)> = revisions
            .iter()
            .map(|r| (r.revision, r.events.len()))
            .collect();
        assert_eq!(shape, vec![(5, 2), (7, 1), (9, 1)]);
    }

    #[test]
    fn created_progress_compacted_and_cancelled_are_told_apart() {
        let now = Instant::now();
        let mut created = answer(1, 20);
        created.created = true;
        assert_eq!(
            read(created, now),
            vec![Answer::Created {
                watch_id: 1,
                revision: 20
            }]
        );
        assert_eq!(
            read(answer(1, 25), now),
            vec![Answer::Progress {
                watch_id: 1,
                revision: 25
            }]
        );
        let mut compacted = answer(2, 30);
        compacted.created = true;
        compacted.canceled = true;
        compacted.compact_revision = 12;
        assert_eq!(
            read(compacted, now),
            vec![Answer::Compacted {
                watch_id: 2,
                compact_revision: 12
            }]
        );
        let mut cancelled = answer(4, 30);
        cancelled.canceled = true;
        cancelled.cancel_reason = "too many watches".into();
        assert_eq!(
            read(cancelled, now),
            vec![Answer::Cancelled {
                watch_id: 4,
                reason: "too many watches".into()
            }]
        );
    }
}
