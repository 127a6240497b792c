//! For the watch tests: a one-member cell inside the test process (on free
//! ports, data in a temporary directory) and the proxy's client of it.

use crate::upstream::{Cell, CellClient};
use latchkey_shared::client::call;
use latchkey_shared::etcd_methods::kv::PUT;
use latchkey_shared::etcdpb::{PbPutRequest, PbPutResponse};
use std::sync::Arc;
use std::time::Duration;
use tonic::transport::Channel;

pub struct TestCell {
    pub handle: latchkey_cell::cell::CellHandle,
    /// The proxy's client of the cell.
    pub cell: Cell,
    _dir: tempfile::TempDir,
}

impl TestCell {
    pub async fn start() -> TestCell {
        let dir = tempfile::tempdir().expect("temp dir");
        let key_file = crate::dev::key_file_in(dir.path()).expect("a key file");
        let handle = crate::dev::start_cell(dir.path(), &key_file, None)
            .await
            .expect("a cell");
        let cell = Arc::new(
            CellClient::new(
                &[handle.client_addr.to_string()],
                Duration::from_secs(5),
                None,
            )
            .expect("a client"),
        );
        let key = latchkey_shared::auth::proxy_key::read_own(&key_file).expect("the key");
        cell.own_credentials.set_proxy_key(Some(&key));
        TestCell {
            handle,
            cell,
            _dir: dir,
        }
    }

    pub fn channel(&self) -> Channel {
        self.cell.members[0].channel.clone()
    }

    /// Writes `key`; returns the revision of the write.
    pub async fn put(&self, key: &str) -> i64 {
        let resp: PbPutResponse = call::unary(
            self.channel(),
            PUT,
            tonic::Request::new(PbPutRequest {
                key: key.as_bytes().to_vec(),
                value: b"v".to_vec(),
                ..Default::default()
            }),
        )
        .await
        .expect("put");
        resp.header.expect("header").revision
    }
}
