//! The cell's scripted etcdctl sessions, unchanged, through a proxy in
//! front of a three-member cell.

use crate::{member_addrs, proxy_bin};
use latchkey_testkit::etcdctl_session::{self, Target};
use latchkey_testkit::{cell_binary, Cluster, ProxyProcess};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_scripted_session_through_a_proxy() {
    let mut cluster = Cluster::start(cell_binary(), 3, &[]).await;
    let proxy = ProxyProcess::start(proxy_bin(), &member_addrs(&cluster), &[]).await;
    etcdctl_session::scripted_session(&mut Target::proxy(&mut cluster, &proxy.grpc)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_watch_members_status_snapshot_lock_and_elect_through_a_proxy() {
    let mut cluster = Cluster::start(cell_binary(), 3, &[]).await;
    let proxy = ProxyProcess::start(proxy_bin(), &member_addrs(&cluster), &[]).await;
    etcdctl_session::watch_members_status_snapshot_lock_and_elect(&mut Target::proxy(
        &mut cluster,
        &proxy.grpc,
    ))
    .await;
}
