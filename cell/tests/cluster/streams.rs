//! Raw gRPC stream clients the tests drive by hand, moved verbatim from the
//! old harness: one `LeaseKeepAlive` stream for many leases, and the
//! batched `Sessions.Refresh` stream. They stay here, not in the testkit,
//! until the one shared client (`latchkey_shared::client`) replaces them.

use latchkey_shared::etcdpb::{PbLeaseKeepAliveRequest, PbLeaseKeepAliveResponse};
use std::collections::BTreeMap;
use std::time::Duration;
use tonic::codegen::http::uri::PathAndQuery;

/// One `LeaseKeepAlive` stream that refreshes many leases, the way a proxy
/// does (etcd-client opens one stream per lease).
pub struct KeepAliveStream {
    tx: tokio::sync::mpsc::Sender<PbLeaseKeepAliveRequest>,
    rx: tonic::Streaming<PbLeaseKeepAliveResponse>,
}

impl KeepAliveStream {
    pub async fn open(addr: &str) -> Result<KeepAliveStream, String> {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .map_err(|e| e.to_string())?
            .connect_timeout(Duration::from_secs(2))
            .connect()
            .await
            .map_err(|e| e.to_string())?;
        let mut grpc = tonic::client::Grpc::new(channel);
        grpc.ready().await.map_err(|e| e.to_string())?;
        let (tx, rx) = tokio::sync::mpsc::channel(16_384);
        let codec =
            tonic_prost::ProstCodec::<PbLeaseKeepAliveRequest, PbLeaseKeepAliveResponse>::default();
        let path = PathAndQuery::from_static("/etcdserverpb.Lease/LeaseKeepAlive");
        let resp = grpc
            .streaming(
                tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(rx)),
                path,
                codec,
            )
            .await
            .map_err(|e| e.to_string())?;
        Ok(KeepAliveStream {
            tx,
            rx: resp.into_inner(),
        })
    }

    /// Refreshes every lease in `ids`; returns the TTL reported for each.
    pub async fn refresh_all(
        &mut self,
        ids: &[i64],
        timeout: Duration,
    ) -> Result<BTreeMap<i64, i64>, String> {
        let deadline = tokio::time::Instant::now() + timeout;
        let sender = self.tx.clone();
        let to_send: Vec<i64> = ids.to_vec();
        let send = tokio::spawn(async move {
            for id in to_send {
                if sender.send(PbLeaseKeepAliveRequest { id }).await.is_err() {
                    break;
                }
            }
        });
        let mut out = BTreeMap::new();
        while out.len() < ids.len() {
            match tokio::time::timeout_at(deadline, self.rx.message()).await {
                Ok(Ok(Some(r))) => {
                    out.insert(r.id, r.ttl);
                }
                Ok(Ok(None)) => return Err("keep-alive stream ended".into()),
                Ok(Err(status)) => return Err(format!("keep-alive stream failed: {status}")),
                Err(_) => {
                    return Err(format!(
                        "only {} of {} keep-alives answered in time",
                        out.len(),
                        ids.len()
                    ))
                }
            }
        }
        let _ = send.await;
        Ok(out)
    }
}

/// A client of the cell's batched refresh extension: one stream, one
/// request per round naming every lease.
pub struct Refresher {
    tx: tokio::sync::mpsc::Sender<latchkey_shared::sessions_pb::RefreshRequest>,
    rx: tonic::Streaming<latchkey_shared::sessions_pb::RefreshResponse>,
    batch: u64,
}

impl Refresher {
    pub async fn open(addr: &str) -> Result<Refresher, String> {
        use latchkey_shared::sessions_pb::sessions_client::SessionsClient;
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .map_err(|e| e.to_string())?
            .connect_timeout(Duration::from_secs(2))
            .connect()
            .await
            .map_err(|e| e.to_string())?;
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let rx = SessionsClient::new(channel)
            .max_decoding_message_size(64 << 20)
            .max_encoding_message_size(64 << 20)
            .refresh(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await
            .map_err(|e| e.to_string())?
            .into_inner();
        Ok(Refresher { tx, rx, batch: 0 })
    }

    /// Refreshes `ids` in one request: per id its TTL, or -1 if gone.
    pub async fn refresh(&mut self, ids: &[i64]) -> Result<Vec<i64>, String> {
        self.batch += 1;
        let req = latchkey_shared::sessions_pb::RefreshRequest {
            batch: self.batch,
            ids: ids.to_vec(),
        };
        self.tx.send(req).await.map_err(|e| e.to_string())?;
        let resp = tokio::time::timeout(Duration::from_secs(10), self.rx.message())
            .await
            .map_err(|_| "no answer in 10 s".to_string())?
            .map_err(|e| e.to_string())?
            .ok_or("the refresh stream ended")?;
        if resp.batch != self.batch {
            return Err(format!("answer to batch {} for {}", resp.batch, self.batch));
        }
        Ok(resp.ttls)
    }
}
