//! [`open_watches`]: one etcd `Watch` stream carrying many watches of one
//! key, for callers that measure or test watch fan-out (the proxy's tests,
//! the watch benchmark) and need raw responses with their watch ids.

use super::call;
use crate::etcd_methods::watch::WATCH;
use crate::etcdpb::{PbWatchRequest, PbWatchRequestUnion, PbWatchResponse};
use crate::ApiError;
use futures::StreamExt;
use tokio::sync::mpsc;
use tonic::transport::Channel;
use tonic::Streaming;

/// Opens a Watch stream on `channel` with `watches` watches of `key` from
/// `start_revision` (0: from the next revision) and returns once every
/// one is created. The stream stays open while the returned sender lives;
/// send more requests (create, cancel, progress) on it.
pub async fn open_watches(
    channel: Channel,
    key: &[u8],
    start_revision: i64,
    watches: usize,
) -> Result<
    (
        mpsc::UnboundedSender<PbWatchRequest>,
        Streaming<PbWatchResponse>,
    ),
    ApiError,
> {
    let (requests, up) = mpsc::unbounded_channel();
    for _ in 0..watches {
        let mut create = PbWatchRequest {
            request_union: Some(PbWatchRequestUnion::CreateRequest(Default::default())),
        };
        if let Some(PbWatchRequestUnion::CreateRequest(c)) = &mut create.request_union {
            c.key = key.to_vec();
            c.start_revision = start_revision;
        }
        // The receiver is in hand: this cannot fail.
        let _ = requests.send(create);
    }
    let mut answers = call::streaming::<PbWatchRequest, PbWatchResponse, _>(
        channel,
        WATCH,
        tonic::Request::new(tokio_stream::wrappers::UnboundedReceiverStream::new(up)),
    )
    .await?;
    let mut created = 0;
    while created < watches {
        match answers.next().await {
            Some(Ok(resp)) if resp.canceled => {
                return Err(ApiError::unavailable(format!(
                    "a watch was refused: {}",
                    resp.cancel_reason
                )))
            }
            Some(Ok(resp)) => created += usize::from(resp.created),
            Some(Err(status)) => return Err(crate::classify_call_failure(&status)),
            None => return Err(ApiError::unavailable("the watch stream ended")),
        }
    }
    Ok((requests, answers))
}
