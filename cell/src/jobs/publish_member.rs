//! A member announces its name and client URL through Raft (etcd publishes
//! member attributes the same way), so MemberList shows every member's
//! client URL.

use crate::node::CellNode;
use crate::raft::command::{Reply, Request, Response};
use std::sync::Arc;
use std::time::Duration;

/// How long to wait before trying again after a failed publication (no
/// leader yet, usually): a few election timeouts.
const RETRY: Duration = Duration::from_millis(500);

pub struct PublishMember {
    pub node: Arc<CellNode>,
}

impl PublishMember {
    /// Publishes until the state holds this member's attributes. Runs until
    /// then or until dropped.
    pub async fn run(self) {
        let node = self.node;
        loop {
            let published = node.state.read(|s| {
                s.members.get(&node.id).is_some_and(|m| {
                    m.client_urls == [node.client_url.clone()] && m.name == node.name
                })
            });
            if published {
                return;
            }
            let req = Request::PublishMember {
                id: node.id,
                name: node.name.clone(),
                client_urls: vec![node.client_url.clone()],
            };
            match node.write(req).await {
                Ok(Response {
                    result: Ok(Reply::Published),
                    ..
                }) => return,
                Ok(other) => tracing::warn!(?other, "publishing member attributes failed"),
                Err(e) => tracing::debug!(error = %e, "publishing member attributes; will retry"),
            }
            tokio::time::sleep(RETRY).await;
        }
    }
}
