//! The queue between a watch stream's task and its gRPC response stream,
//! bounded in bytes as well as in responses.
//!
//! Bounded by count alone, a client that stops reading let 64 responses of
//! up to `--max-request-bytes` each (96 MiB with the default) pile up on
//! the member for one stream. Each queued response now also holds its
//! encoded size from a budget of [`BUDGET_BYTES`], given back when gRPC
//! takes it to send, so a stalled stream holds at most that much here (plus
//! what HTTP/2 flow control lets into the connection's send buffer).

use latchkey_shared::etcdpb::PbWatchResponse;
use prost::Message;
use std::pin::Pin;
use std::sync::Arc;
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio_stream::{Stream, StreamExt};
use tonic::Status;

/// Responses queued per stream before its task waits for the client.
const QUEUE: usize = 64;

/// Encoded bytes queued per stream before its task waits for the client.
/// A larger response (one revision can be larger) waits until the queue is
/// empty and then goes alone.
pub const BUDGET_BYTES: usize = 4 << 20;

type Item = Result<PbWatchResponse, Status>;

/// The sending side, owned by the stream's task.
pub struct Outbound {
    tx: mpsc::Sender<(Item, OwnedSemaphorePermit)>,
    budget: Arc<Semaphore>,
}

/// The client went away.
#[derive(Debug)]
pub struct Closed;

/// What tonic sends from.
pub type Responses = Pin<Box<dyn Stream<Item = Item> + Send + 'static>>;

/// A queue and the response stream that drains it.
pub fn channel() -> (Outbound, Responses) {
    let (tx, rx) = mpsc::channel(QUEUE);
    let budget = Arc::new(Semaphore::new(BUDGET_BYTES));
    let responses = tokio_stream::wrappers::ReceiverStream::new(rx).map(|(item, permit)| {
        drop(permit);
        item
    });
    (Outbound { tx, budget }, Box::pin(responses))
}

impl Outbound {
    /// Queues `item`, waiting while the queue is full by count or bytes.
    pub async fn send(&self, item: Item) -> Result<(), Closed> {
        let size = item.as_ref().map_or(0, Message::encoded_len);
        let cost = size.clamp(1, BUDGET_BYTES) as u32;
        let permit = self
            .budget
            .clone()
            .acquire_many_owned(cost)
            .await
            .map_err(|_| Closed)?;
        self.tx.send((item, permit)).await.map_err(|_| Closed)
    }

    /// Whether the client has yet to take something already queued.
    pub fn reader_behind(&self) -> bool {
        self.tx.capacity() < self.tx.max_capacity()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use latchkey_shared::etcdpb::PbEvent;
    use std::time::Duration;

    fn response_of(bytes: usize) -> Item {
        let event = PbEvent {
            kv: Some(latchkey_shared::etcdpb::PbKeyValue {
                value: vec![0; bytes],
                ..Default::default()
            }),
            ..Default::default()
        };
        Ok(PbWatchResponse {
            events: vec![event],
            ..Default::default()
        })
    }

    #[tokio::test]
    async fn a_reader_that_takes_nothing_holds_up_the_sender_at_the_byte_budget() {
        let (out, mut responses) = channel();
        let each = 512 * 1024;
        let mut queued = 0;
        while tokio::time::timeout(Duration::from_millis(100), out.send(response_of(each)))
            .await
            .is_ok()
        {
            queued += 1;
            assert!(queued <= QUEUE, "the queue never filled");
        }
        // Eight responses of 512 KiB fill 4 MiB, less their few bytes of
        // framing: seven fit.
        assert_eq!(queued, BUDGET_BYTES / each - 1);
        assert!(out.reader_behind());
        // Taking one makes room for one more.
        assert!(responses.next().await.is_some());
        tokio::time::timeout(Duration::from_secs(1), out.send(response_of(each)))
            .await
            .expect("room after a response was taken")
            .expect("the reader is there");
    }

    #[tokio::test]
    async fn a_response_larger_than_the_budget_goes_alone_and_a_gone_reader_is_an_error() {
        let (out, mut responses) = channel();
        out.send(response_of(BUDGET_BYTES * 2))
            .await
            .expect("sent alone");
        assert!(responses.next().await.is_some());
        assert!(!out.reader_behind());
        drop(responses);
        assert!(out.send(response_of(1)).await.is_err());
    }
}
