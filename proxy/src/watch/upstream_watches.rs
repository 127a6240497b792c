//! [`UpstreamWatches`]: the proxy's watches on one cell's members:
//! multiplexed [`MemberStream`]s per member, opened on first use, each
//! carrying up to [`WATCHES_PER_STREAM`] watches (another is opened past
//! that, or when the member refuses one for its own per-stream limit), and
//! the creation of an upstream watch on a member that is up, tried member
//! by member by the cell client's retry rules. The coalescer creates shared
//! watches and catch-up watches through it; a pump resumes its watch
//! through it when a member's stream fails.

use super::member_stream::{CreateWatch, MemberStream, MemberStreamHandle};
use super::upstream_answer::Answer;
use super::watch_key::WatchKey;
use crate::upstream::{Cell, Kind, Route};
use latchkey_shared::etcd_methods::watch::WATCH;
use latchkey_shared::ApiError;
use std::collections::HashMap;
use tokio::sync::mpsc;

/// An upstream watch just created on a member.
pub struct Opened {
    pub stream: MemberStreamHandle,
    pub watch_id: i64,
    pub answers: mpsc::UnboundedReceiver<Answer>,
    /// It reports every revision after this one.
    pub revision: i64,
}

/// Watches one upstream stream carries before the next is opened. The
/// member delivers each event by looking at every watch on its stream, so
/// smaller streams also cost it less per event; the cell's own limit is
/// `--max-watches-per-stream` (100 000).
pub const WATCHES_PER_STREAM: usize = 10_000;

pub struct UpstreamWatches {
    cell: Cell,
    /// The streams to each member index, opened as needed.
    streams: tokio::sync::Mutex<HashMap<usize, Vec<MemberStreamHandle>>>,
}

impl UpstreamWatches {
    pub fn new(cell: Cell) -> UpstreamWatches {
        UpstreamWatches {
            cell,
            streams: tokio::sync::Mutex::new(HashMap::new()),
        }
    }

    /// Asks every member stream for a progress answer.
    pub async fn request_progress(&self) {
        for stream in self.streams.lock().await.values().flatten() {
            stream.progress();
        }
    }

    /// A stream to `member` with room for another watch, opened if none
    /// has (closed streams are let go).
    async fn stream(&self, member: usize) -> Result<MemberStreamHandle, ApiError> {
        let mut streams = self.streams.lock().await;
        let of_member = streams.entry(member).or_default();
        of_member.retain(|s| !s.is_closed());
        if let Some(stream) = of_member
            .iter()
            .find(|s| !s.is_full() && s.watches() < WATCHES_PER_STREAM)
        {
            return Ok(stream.clone());
        }
        let stream = MemberStream::open(
            self.cell.members[member].channel.clone(),
            &self.cell.own_credentials,
        )
        .await?;
        of_member.push(stream.clone());
        Ok(stream)
    }

    /// Creates `key` upstream from `start_revision` on a member that is
    /// up (the leader when known, for a key [`WatchKey::from_leader`]),
    /// trying the members in turn by the cell client's retry rules (a
    /// compacted start is final), for up to the request timeout.
    pub async fn open(&self, key: &WatchKey, start_revision: i64) -> Result<Opened, ApiError> {
        let route = if key.from_leader {
            Route::Leader
        } else {
            Route::Any
        };
        self.cell
            .retrying(route, Kind::Read, WATCH, |member, _| {
                self.open_on(key, start_revision, member)
            })
            .await
    }

    /// One attempt of [`UpstreamWatches::open`], on `member`: on a stream
    /// with room, and once more on another if the member finds that one
    /// full.
    async fn open_on(
        &self,
        key: &WatchKey,
        start_revision: i64,
        member: usize,
    ) -> Result<Opened, ApiError> {
        match self.open_on_stream(key, start_revision, member).await {
            Err(e) if e.code == latchkey_shared::ErrorCode::TooManyWatches => {
                self.open_on_stream(key, start_revision, member).await
            }
            opened => opened,
        }
    }

    async fn open_on_stream(
        &self,
        key: &WatchKey,
        start_revision: i64,
        member: usize,
    ) -> Result<Opened, ApiError> {
        let stream = self.stream(member).await?;
        let (watch_id, mut answers) = stream
            .create(CreateWatch {
                key: key.range.start.clone(),
                range_end: key.range.end.clone(),
                filters: key.filters.clone(),
                prev_kv: key.prev_kv,
                start_revision,
            })
            .await?;
        match tokio::time::timeout(self.cell.request_timeout, answers.recv()).await {
            Ok(Some(Answer::Created { revision, .. })) => Ok(Opened {
                stream,
                watch_id,
                answers,
                revision,
            }),
            Ok(Some(Answer::Compacted {
                compact_revision, ..
            })) => Err(ApiError::compacted(compact_revision)),
            // Refused at once: for the stream's limit (the stream is now
            // marked full), or for what the watch asks.
            Ok(Some(Answer::Cancelled { reason, .. })) => {
                if ApiError::is_too_many_watches(&reason) {
                    Err(ApiError::new(
                        latchkey_shared::ErrorCode::TooManyWatches,
                        format!("the member refused the watch: {reason}"),
                    ))
                } else {
                    Err(ApiError::invalid(format!(
                        "the member refused the watch: {reason}"
                    )))
                }
            }
            Ok(Some(other)) => Err(ApiError::internal(format!(
                "a watch's first answer was {other:?}"
            ))),
            Ok(None) => Err(ApiError::unavailable("the member's watch stream failed")),
            Err(_) => Err(ApiError::unavailable(
                "the member did not create the watch in time",
            )),
        }
    }
}
