//! etcd's own command-line client (Debian's etcd-client package, etcd 3.4)
//! against a three-member cell's members: the scripted sessions of
//! `latchkey_testkit::etcdctl_session`, which the proxy's tests run
//! unchanged through a proxy.

use crate::CELL_BIN;
use latchkey_testkit::etcdctl_session::{self, Target};
use latchkey_testkit::Cluster;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_scripted_session() {
    let mut cluster = Cluster::start(CELL_BIN, 3, &[]).await;
    etcdctl_session::scripted_session(&mut Target::members(&mut cluster)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_watch_members_status_snapshot_lock_and_elect() {
    let mut cluster = Cluster::start(CELL_BIN, 3, &[]).await;
    etcdctl_session::watch_members_status_snapshot_lock_and_elect(&mut Target::members(
        &mut cluster,
    ))
    .await;
}
