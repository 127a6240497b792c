//! etcd's gRPC API with hostile messages: KV, Lease, Watch, Lock,
//! Election, Maintenance's reads and the sessions extension, on the
//! proxy's port or the cell's, over a real HTTP/2 connection; tonic's
//! decoding, the handlers, Raft and the state machine meet the bytes as
//! they come. Fails on a panic anywhere in the process, or on a call that
//! is not answered in time.
//!
//! Input: a byte choosing the method (its high bit: the cell's port, not
//! the proxy's), then up to eight messages, each prefixed by its length
//! (two bytes, little-endian), sent as the call's request stream.
//!
//! Membership changes, alarms, Defragment, MoveLeader, Downgrade and
//! Snapshot are left out: they change or stop the one-member cell every
//! input shares, or stream all of it.

#![no_main]

use latchkey_fuzz::live::Live;
use latchkey_fuzz::raw_codec::RawCodec;
use latchkey_fuzz::Input;
use latchkey_shared::etcd_methods::{cluster, maintenance, STREAMING, UNARY};
use libfuzzer_sys::fuzz_target;
use std::sync::LazyLock;
use std::time::Duration;
use tonic::codegen::http::uri::PathAndQuery;

/// What would change or stop the one cell every input shares, or stream
/// all of it.
const LEFT_OUT: [&str; 9] = [
    cluster::MEMBER_ADD,
    cluster::MEMBER_REMOVE,
    cluster::MEMBER_UPDATE,
    cluster::MEMBER_PROMOTE,
    maintenance::ALARM,
    maintenance::DEFRAGMENT,
    maintenance::MOVE_LEADER,
    maintenance::DOWNGRADE,
    maintenance::SNAPSHOT,
];

/// The methods an input may call, by its first byte: etcd's unary ones,
/// then its streaming ones (in `etcd_methods`' order, without
/// [`LEFT_OUT`]), then the sessions extension's refresh stream.
static METHODS: LazyLock<Vec<&'static str>> = LazyLock::new(|| {
    UNARY
        .iter()
        .chain(STREAMING.iter())
        .filter(|m| !LEFT_OUT.contains(m))
        .copied()
        .chain(["/latchkey.sessions.v1.Sessions/Refresh"])
        .collect()
});

/// The deadline the call carries; the cell's request timeout is shorter.
const DEADLINE: Duration = Duration::from_secs(3);
/// Longer than the deadline: an answer not in by then hangs.
const ANSWER_WITHIN: Duration = Duration::from_secs(30);
/// How many messages of a streamed answer are read.
const READ_MESSAGES: usize = 4;

fuzz_target!(|data: &[u8]| {
    let mut input = Input::new(data);
    let choice = input.byte();
    let method = METHODS[(choice & 0x7f) as usize % METHODS.len()];
    let mut messages = Vec::new();
    while !input.is_empty() && messages.len() < 8 {
        messages.push(input.chunk().to_vec());
    }
    let live = Live::get();
    let channel = match choice & 0x80 {
        0 => live.proxy_grpc.clone(),
        _ => live.cell_grpc.clone(),
    };
    live.runtime.block_on(async {
        let call = async {
            let mut grpc = tonic::client::Grpc::new(channel);
            if grpc.ready().await.is_err() {
                return;
            }
            let mut request = tonic::Request::new(tokio_stream::iter(messages));
            request.set_timeout(DEADLINE);
            let path = PathAndQuery::from_static(method);
            let Ok(response) = grpc.streaming(request, path, RawCodec).await else {
                return;
            };
            let mut answers = response.into_inner();
            for _ in 0..READ_MESSAGES {
                match tokio::time::timeout(Duration::from_millis(100), answers.message()).await {
                    Ok(Ok(Some(_))) => continue,
                    _ => break,
                }
            }
        };
        tokio::time::timeout(ANSWER_WITHIN, call)
            .await
            .expect("a gRPC call was not answered within 30 s");
    });
});
