//! [`MemberStream`]: ONE upstream Watch stream to one cell member carrying
//! many watches (DESIGN section 1: one multiplexed watch stream per member
//! a proxy uses). One task owns the stream; callers talk to it through a
//! [`MemberStreamHandle`]: create a watch (the proxy picks its id, so
//! answers are routed without guessing which create they belong to),
//! cancel one, ask for progress.
//!
//! Each watch's answers go to its own unbounded channel. Unbounded is safe
//! here: the reader of each is one task that only moves revisions into a
//! [`SharedWatch`](super::SharedWatch), whose own queues are bounded, and
//! never waits on a client.
//!
//! When the stream fails, the task ends and every watch's channel closes:
//! that is how a watch learns its member is gone, and it resumes on
//! another member from the first revision it has not published. The
//! stream asks for etcd's require-leader, so a member that has lost its
//! leader (cut off from its peers) ends it too.

use super::upstream_answer::{read, Answer};
use crate::metrics_catalog::UPSTREAM_WATCH_STREAMS;
use latchkey_shared::client::call;
use latchkey_shared::client::OwnCredentials;
use latchkey_shared::etcd_methods::watch::WATCH;
use latchkey_shared::etcd_methods::REQUIRE_LEADER;
use latchkey_shared::etcdpb::{PbWatchRequest, PbWatchRequestUnion, PbWatchResponse};
use latchkey_shared::ApiError;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_stream::StreamExt;
use tonic::transport::Channel;

/// The watch id etcd gives answers that concern the whole stream (a
/// progress answer to a WatchProgress request).
const STREAM_WIDE: i64 = -1;

/// What a watch asks for.
#[derive(Debug, Clone)]
pub struct CreateWatch {
    pub key: Vec<u8>,
    pub range_end: Vec<u8>,
    pub filters: Vec<i32>,
    pub prev_kv: bool,
    /// 0: from the next revision.
    pub start_revision: i64,
}

enum Command {
    Create {
        watch: CreateWatch,
        answers: mpsc::UnboundedSender<Answer>,
        id: oneshot::Sender<i64>,
    },
    Cancel {
        watch_id: i64,
    },
    /// A progress request; its answer goes to this watch only, or to
    /// every watch on the stream.
    Progress {
        for_watch: Option<i64>,
    },
}

/// Talks to the task that owns one member's stream.
#[derive(Clone)]
pub struct MemberStreamHandle {
    commands: mpsc::UnboundedSender<Command>,
    load: Arc<Load>,
}

/// How full one stream is, as its task last counted.
#[derive(Default)]
struct Load {
    /// Watches on the stream (created or being created).
    watches: AtomicUsize,
    /// The member refused a watch on this stream for its limit.
    full: AtomicBool,
}

impl MemberStreamHandle {
    /// Creates a watch; its answers (the first one `Created`, or
    /// `Compacted`/`Cancelled`) arrive on the returned channel, which
    /// closes if the member's stream fails. Returns the watch id.
    pub async fn create(
        &self,
        watch: CreateWatch,
    ) -> Result<(i64, mpsc::UnboundedReceiver<Answer>), ApiError> {
        let (answers, rx) = mpsc::unbounded_channel();
        let (id, id_rx) = oneshot::channel();
        self.commands
            .send(Command::Create { watch, answers, id })
            .map_err(|_| ApiError::unavailable("the member's watch stream is gone"))?;
        let watch_id = id_rx
            .await
            .map_err(|_| ApiError::unavailable("the member's watch stream is gone"))?;
        Ok((watch_id, rx))
    }

    /// Cancels a watch (its channel closes once the member confirms).
    pub fn cancel(&self, watch_id: i64) {
        let _ = self.commands.send(Command::Cancel { watch_id });
    }

    /// Asks the member for a progress answer for every watch on the stream.
    pub fn progress(&self) {
        let _ = self.commands.send(Command::Progress { for_watch: None });
    }

    /// Asks the member for a progress answer and hands it to `watch_id`
    /// only. (The answer speaks for every watch on the stream, but handing
    /// it to each costs a message and a wake-up per watch: a proxy's read
    /// cache keeps thousands of watches on a stream, and one lock waiter's
    /// catch-up asks several times.)
    pub fn progress_of(&self, watch_id: i64) {
        let _ = self.commands.send(Command::Progress {
            for_watch: Some(watch_id),
        });
    }

    /// Whether the stream's task has ended.
    pub fn is_closed(&self) -> bool {
        self.commands.is_closed()
    }

    /// Watches on the stream (created or being created).
    pub fn watches(&self) -> usize {
        self.load.watches.load(Ordering::Relaxed)
    }

    /// Whether the member has refused a watch on this stream for its
    /// per-stream limit: new watches go to another stream.
    pub fn is_full(&self) -> bool {
        self.load.full.load(Ordering::Relaxed)
    }
}

pub struct MemberStream;

impl MemberStream {
    /// Opens a Watch stream on `channel` as the proxy (presenting `own`)
    /// and spawns its task.
    pub async fn open(
        channel: Channel,
        own: &OwnCredentials,
    ) -> Result<MemberStreamHandle, ApiError> {
        let (requests, up) = mpsc::unbounded_channel::<PbWatchRequest>();
        // Require-leader, as etcd's grpc-proxy: a member that has lost its
        // leader ends the stream, and every watch on it resumes on another
        // member, instead of waiting on one cut off from the cell.
        let mut request =
            tonic::Request::new(tokio_stream::wrappers::UnboundedReceiverStream::new(up));
        request.metadata_mut().insert(
            REQUIRE_LEADER,
            tonic::metadata::MetadataValue::from_static("true"),
        );
        own.attach(&mut request);
        let answers =
            call::streaming::<PbWatchRequest, PbWatchResponse, _>(channel, WATCH, request).await?;
        let (commands, inbox) = mpsc::unbounded_channel();
        let load = Arc::new(Load::default());
        tokio::spawn(run(requests, answers, inbox, load.clone()));
        Ok(MemberStreamHandle { commands, load })
    }
}

async fn run(
    requests: mpsc::UnboundedSender<PbWatchRequest>,
    mut answers: tonic::Streaming<PbWatchResponse>,
    mut inbox: mpsc::UnboundedReceiver<Command>,
    load: Arc<Load>,
) {
    let mut watches: HashMap<i64, Watch> = HashMap::new();
    // Creates sent and not yet answered, in the order sent: the member
    // answers them in that order, and refuses one with the id -1 (as etcd
    // does), so a refusal is the oldest one's.
    let mut unanswered: VecDeque<i64> = VecDeque::new();
    // Progress requests sent and not yet answered, in the order sent (the
    // member answers them in that order), each with whom its answer is for
    // (`None`: every watch).
    let mut progress_asked: VecDeque<Option<i64>> = VecDeque::new();
    let mut next_id: i64 = 1;
    metrics::gauge!(UPSTREAM_WATCH_STREAMS.name).increment(1.0);
    loop {
        load.watches.store(watches.len(), Ordering::Relaxed);
        tokio::select! {
            command = inbox.recv() => match command {
                Some(Command::Create { watch, answers: sink, id }) => {
                    let watch_id = next_id;
                    next_id += 1;
                    let mut request = PbWatchRequest {
                        request_union: Some(PbWatchRequestUnion::CreateRequest(Default::default())),
                    };
                    if let Some(PbWatchRequestUnion::CreateRequest(c)) = &mut request.request_union {
                        c.key = watch.key;
                        c.range_end = watch.range_end;
                        c.filters = watch.filters;
                        c.prev_kv = watch.prev_kv;
                        c.start_revision = watch.start_revision;
                        c.watch_id = watch_id;
                    }
                    if requests.send(request).is_err() {
                        break;
                    }
                    watches.insert(watch_id, Watch { sink, created: false });
                    unanswered.push_back(watch_id);
                    let _ = id.send(watch_id);
                }
                Some(Command::Cancel { watch_id }) => {
                    let mut request = PbWatchRequest {
                        request_union: Some(PbWatchRequestUnion::CancelRequest(Default::default())),
                    };
                    if let Some(PbWatchRequestUnion::CancelRequest(c)) = &mut request.request_union {
                        c.watch_id = watch_id;
                    }
                    watches.remove(&watch_id);
                    if requests.send(request).is_err() {
                        break;
                    }
                }
                Some(Command::Progress { for_watch }) => {
                    let request = PbWatchRequest {
                        request_union: Some(PbWatchRequestUnion::ProgressRequest(Default::default())),
                    };
                    if requests.send(request).is_err() {
                        break;
                    }
                    progress_asked.push_back(for_watch);
                }
                // Every handle is gone: nobody watches through this stream.
                None => break,
            },
            answer = answers.next() => match answer {
                Some(Ok(resp)) => {
                    for answer in read(resp, Instant::now()) {
                        let Some(answer) = claim(&mut unanswered, answer, &load) else {
                            continue;
                        };
                        route(&mut watches, answer, &mut progress_asked);
                    }
                }
                Some(Err(status)) => {
                    tracing::debug!(error = %status, "upstream watch stream failed");
                    break;
                }
                None => break,
            },
        }
    }
    metrics::gauge!(UPSTREAM_WATCH_STREAMS.name).decrement(1.0);
    // Dropping `watches` closes every watch's channel: they resume elsewhere.
}

/// Gives a refusal (id -1) the id of the create it answers, the oldest
/// unanswered one, and marks the stream full when the refusal is for the
/// member's per-stream limit; `None` for what belongs to no watch (the
/// refusal's own "created" half).
fn claim(unanswered: &mut VecDeque<i64>, answer: Answer, load: &Load) -> Option<Answer> {
    match answer {
        Answer::Created {
            watch_id: STREAM_WIDE,
            ..
        } => None,
        Answer::Cancelled {
            watch_id: STREAM_WIDE,
            reason,
        } => {
            if ApiError::is_too_many_watches(&reason) {
                load.full.store(true, Ordering::Relaxed);
            }
            let watch_id = unanswered.pop_front()?;
            Some(Answer::Cancelled { watch_id, reason })
        }
        Answer::Created { watch_id, .. } => {
            unanswered.retain(|id| *id != watch_id);
            Some(answer)
        }
        other => Some(other),
    }
}

/// One watch on the stream.
struct Watch {
    sink: mpsc::UnboundedSender<Answer>,
    /// The member answered its create. A stream-wide progress answer
    /// speaks only for created watches: one still being created hears
    /// `Created` first.
    created: bool,
}

/// Hands `answer` to its watch; a stream-wide progress answer to whom
/// the oldest unanswered progress request asked for (every created watch
/// when that was everyone, or when no request is known: the answer is
/// true for each).
fn route(
    watches: &mut HashMap<i64, Watch>,
    answer: Answer,
    progress_asked: &mut VecDeque<Option<i64>>,
) {
    let watch_id = match &answer {
        Answer::Created { watch_id, .. }
        | Answer::Revisions { watch_id, .. }
        | Answer::Progress { watch_id, .. }
        | Answer::Compacted { watch_id, .. }
        | Answer::Cancelled { watch_id, .. } => *watch_id,
    };
    if watch_id == STREAM_WIDE {
        if let Answer::Progress { revision, .. } = answer {
            let audience = progress_asked.pop_front().flatten();
            let for_audience = |id: &i64| audience.is_none_or(|only| only == *id);
            for (id, watch) in watches
                .iter()
                .filter(|(id, w)| w.created && for_audience(id))
            {
                let _ = watch.sink.send(Answer::Progress {
                    watch_id: *id,
                    revision,
                });
            }
        }
        return;
    }
    let ends = matches!(answer, Answer::Compacted { .. } | Answer::Cancelled { .. });
    if let Some(watch) = watches.get_mut(&watch_id) {
        watch.created |= matches!(answer, Answer::Created { .. });
        let _ = watch.sink.send(answer);
    }
    if ends {
        watches.remove(&watch_id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::watch::test_cell::TestCell;

    async fn next(rx: &mut mpsc::UnboundedReceiver<Answer>) -> Answer {
        tokio::time::timeout(std::time::Duration::from_secs(10), rx.recv())
            .await
            .expect("an answer in time")
            .expect("the stream is open")
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn many_watches_share_one_stream_and_each_gets_its_own_answers() {
        let cell = TestCell::start().await;
        let stream = MemberStream::open(cell.channel(), &OwnCredentials::default())
            .await
            .expect("stream");
        let watch = |key: &str| CreateWatch {
            key: key.as_bytes().to_vec(),
            range_end: vec![],
            filters: vec![],
            prev_kv: false,
            start_revision: 0,
        };
        let (a_id, mut a) = stream.create(watch("a")).await.expect("watch a");
        let (b_id, mut b) = stream.create(watch("b")).await.expect("watch b");
        assert_ne!(a_id, b_id);
        assert!(matches!(next(&mut a).await, Answer::Created { .. }));
        assert!(matches!(next(&mut b).await, Answer::Created { .. }));
        let rev_b = cell.put("b").await;
        let rev_a = cell.put("a").await;
        match next(&mut a).await {
            Answer::Revisions { revisions, .. } => {
                assert_eq!(
                    revisions.iter().map(|r| r.revision).collect::<Vec<_>>(),
                    vec![rev_a]
                )
            }
            other => panic!("{other:?}"),
        }
        match next(&mut b).await {
            Answer::Revisions { revisions, .. } => {
                assert_eq!(
                    revisions.iter().map(|r| r.revision).collect::<Vec<_>>(),
                    vec![rev_b]
                )
            }
            other => panic!("{other:?}"),
        }
        // A progress request reaches every watch on the stream.
        stream.progress();
        for rx in [&mut a, &mut b] {
            match next(rx).await {
                Answer::Progress { revision, .. } => assert!(revision >= rev_a),
                other => panic!("{other:?}"),
            }
        }
        // Progress asked for one watch reaches that watch only; the next
        // asked for all reaches b, whose first answer since is that one.
        stream.progress_of(a_id);
        stream.progress();
        match next(&mut a).await {
            Answer::Progress { watch_id, .. } => assert_eq!(watch_id, a_id),
            other => panic!("{other:?}"),
        }
        assert!(matches!(next(&mut a).await, Answer::Progress { .. }));
        assert!(matches!(next(&mut b).await, Answer::Progress { .. }));
        let rev_c = cell.put("b").await;
        match next(&mut b).await {
            Answer::Revisions { revisions, .. } => {
                assert_eq!(revisions[0].revision, rev_c, "b heard one progress answer")
            }
            other => panic!("{other:?}"),
        }
        // The member goes away: every watch's channel closes.
        cell.handle.shutdown().await.expect("shutdown");
        for rx in [&mut a, &mut b] {
            let end = tokio::time::timeout(std::time::Duration::from_secs(10), async {
                while rx.recv().await.is_some() {}
            })
            .await;
            assert!(
                end.is_ok(),
                "a watch's channel stayed open after its member left"
            );
        }
    }
}
