//! Watches through the etcd-client crate: order, history replay,
//! compaction, prev_kv, filters, progress, many watches on one stream, and
//! a watcher that stops reading while writers go on.

use crate::CELL_BIN;
use etcd_client::{
    Client, EventType, GetOptions, PutOptions, WatchFilterType, WatchOptions, WatchResponse,
    WatchStream,
};
use latchkey_testkit::process::rss_bytes;
use latchkey_testkit::{err_text, eventually, metric_value, numbered, put_all, Cluster};
use std::collections::HashMap;
use tokio::time::{Duration, Instant};

/// (type, key, value, mod_revision) of an event, for comparisons.
type Seen = (&'static str, String, String, i64);

fn seen(resp: &WatchResponse) -> Vec<Seen> {
    resp.events()
        .iter()
        .map(|e| {
            let kv = e.kv().expect("event kv");
            let kind = match e.event_type() {
                EventType::Put => "PUT",
                EventType::Delete => "DELETE",
            };
            (
                kind,
                kv.key_str().expect("utf-8").to_string(),
                kv.value_str().expect("utf-8").to_string(),
                kv.mod_revision(),
            )
        })
        .collect()
}

/// The next response on `stream`, within 10 s.
async fn next(stream: &mut WatchStream) -> WatchResponse {
    tokio::time::timeout(Duration::from_secs(10), stream.message())
        .await
        .expect("a watch response within 10 s")
        .expect("watch stream ok")
        .expect("watch stream open")
}

/// Opens a watch and checks the `created` response; returns its stream.
async fn open(client: &mut Client, key: &str, options: WatchOptions) -> WatchStream {
    let mut stream = client.watch(key, Some(options)).await.expect("watch");
    let created = next(&mut stream).await;
    assert!(
        created.created(),
        "first response is `created`: {created:?}"
    );
    stream
}

/// Collects events until `n` have arrived (bounded by 10 s per response).
async fn events(stream: &mut WatchStream, n: usize) -> Vec<Seen> {
    let mut out = Vec::new();
    while out.len() < n {
        let resp = next(stream).await;
        assert!(!resp.canceled(), "unexpected cancel: {resp:?}");
        out.extend(seen(&resp));
    }
    out
}

async fn put(client: &mut Client, key: &str, value: &str) -> i64 {
    client
        .put(key, value, None)
        .await
        .expect("put")
        .header()
        .expect("header")
        .revision()
}

async fn delete(client: &mut Client, key: &str) -> i64 {
    client
        .delete(key, None)
        .await
        .expect("delete")
        .header()
        .expect("header")
        .revision()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_follow_history_and_live_changes_like_etcd() {
    let cluster =
        Cluster::start(CELL_BIN, 3, &["--watch-progress-notify-interval-ms", "500"]).await;
    let leader = cluster.leader_at_start();
    let follower = cluster.follower();
    // Writes go through the leader; watches are served by a follower from
    // its own applied state.
    let mut writer = cluster.client(leader).await;
    let mut watcher = cluster.client(follower).await;

    let r1 = put(&mut writer, "a/1", "one").await;
    let r2 = put(&mut writer, "a/2", "two").await;
    put(&mut writer, "b/x", "other").await;
    let r4 = delete(&mut writer, "a/1").await;

    // History replay: exactly the changes since r1, in revision order.
    let mut replay = open(
        &mut watcher,
        "a/",
        WatchOptions::new().with_prefix().with_start_revision(r1),
    )
    .await;
    assert_eq!(
        events(&mut replay, 3).await,
        vec![
            ("PUT", "a/1".into(), "one".into(), r1),
            ("PUT", "a/2".into(), "two".into(), r2),
            ("DELETE", "a/1".into(), "".into(), r4),
        ]
    );
    // ...then live changes on the same watch, nothing missed or repeated.
    let r5 = put(&mut writer, "a/3", "three").await;
    put(&mut writer, "b/y", "ignored").await;
    let r7 = delete(&mut writer, "a/2").await;
    assert_eq!(
        events(&mut replay, 2).await,
        vec![
            ("PUT", "a/3".into(), "three".into(), r5),
            ("DELETE", "a/2".into(), "".into(), r7),
        ]
    );

    // prev_kv with the NOPUT filter: only deletes, each with the old value.
    let mut deletes = open(
        &mut watcher,
        "c/",
        WatchOptions::new()
            .with_prefix()
            .with_prev_key()
            .with_filters([WatchFilterType::NoPut]),
    )
    .await;
    // NODELETE: only puts.
    let mut puts = watcher
        .watch(
            "c/",
            Some(
                WatchOptions::new()
                    .with_prefix()
                    .with_filters([WatchFilterType::NoDelete]),
            ),
        )
        .await
        .expect("watch");
    let created = next(&mut puts).await;
    assert!(created.created());
    let puts_id = created.watch_id();
    let c1 = put(&mut writer, "c/k", "v1").await;
    let c2 = put(&mut writer, "c/k", "v2").await;
    writer.delete("c/k", None).await.expect("delete");
    let resp = next(&mut deletes).await;
    assert_eq!(resp.events().len(), 1, "{resp:?}");
    let event = &resp.events()[0];
    assert_eq!(event.event_type(), EventType::Delete);
    let prev = event.prev_kv().expect("prev_kv requested");
    assert_eq!(
        (prev.value_str().ok(), prev.mod_revision()),
        (Some("v2"), c2)
    );
    let put_events = events(&mut puts, 2).await;
    assert_eq!(
        put_events,
        vec![
            ("PUT", "c/k".into(), "v1".into(), c1),
            ("PUT", "c/k".into(), "v2".into(), c2),
        ]
    );

    // Compaction: a watch from before the compact revision is cancelled
    // with it; one from the compact revision itself still works.
    let compact_at = put(&mut writer, "d/k", "x").await;
    writer.compact(compact_at, None).await.expect("compact");
    // A linearizable read through the follower returns once the follower
    // has applied everything committed before it: the compaction too.
    watcher.get("d/k", None).await.expect("linearizable read");
    let mut old = watcher
        .watch(
            "a/",
            Some(WatchOptions::new().with_prefix().with_start_revision(r1)),
        )
        .await
        .expect("watch");
    let mut cancel = next(&mut old).await;
    if cancel.created() && !cancel.canceled() {
        cancel = next(&mut old).await;
    }
    assert!(cancel.canceled(), "{cancel:?}");
    assert_eq!(cancel.compact_revision(), compact_at);
    let mut at_compact = open(
        &mut watcher,
        "d/",
        WatchOptions::new()
            .with_prefix()
            .with_start_revision(compact_at),
    )
    .await;
    assert_eq!(
        events(&mut at_compact, 1).await,
        vec![("PUT", "d/k".into(), "x".into(), compact_at)]
    );

    // Progress: an idle watch that asked for it hears the current revision.
    let mut idle = open(
        &mut watcher,
        "idle/",
        WatchOptions::new().with_prefix().with_progress_notify(),
    )
    .await;
    let progress = next(&mut idle).await;
    assert!(progress.events().is_empty() && !progress.canceled());
    assert!(progress.header().expect("header").revision() >= compact_at);
    // And on request, for the whole stream.
    idle.request_progress().await.expect("request progress");
    let mut asked = next(&mut idle).await;
    while asked.watch_id() != -1 {
        asked = next(&mut idle).await;
    }
    assert!(asked.events().is_empty());
    assert!(asked.header().expect("header").revision() >= compact_at);

    // Cancel: acknowledged, and nothing more arrives for that watch while
    // its stream stays open and goes past the next write.
    puts.cancel(puts_id).await.expect("cancel");
    let canceled = next(&mut puts).await;
    assert!(
        canceled.canceled() && canceled.watch_id() == puts_id,
        "{canceled:?}"
    );
    let after_cancel = put(&mut writer, "c/k", "after-cancel").await;
    let quiet = tokio::time::timeout(Duration::from_millis(500), puts.message()).await;
    assert!(
        quiet.is_err(),
        "the stream of a cancelled watch must stay open and quiet: {quiet:?}"
    );
    // Proof that the stream is alive and has seen that write: progress at
    // or past its revision, and no event before it.
    eventually(Duration::from_secs(10), async || {
        puts.request_progress().await.map_err(|e| e.to_string())?;
        let progress = next(&mut puts).await;
        assert!(
            progress.events().is_empty() && progress.watch_id() == -1,
            "a cancelled watch's stream sent {progress:?}"
        );
        let revision = progress.header().expect("header").revision();
        if revision >= after_cancel {
            Ok(())
        } else {
            Err(format!(
                "progress at {revision}, the write at {after_cancel}"
            ))
        }
    })
    .await;

    // The follower reports its watches: open now are replay, deletes,
    // at_compact and idle, on six streams (puts and old keep theirs open);
    // events sent were 5 + 1 + 2 + 1.
    let metrics = cluster.metrics(follower).await;
    let value = |series: &str| {
        metric_value(&metrics, series).unwrap_or_else(|| panic!("/metrics lacks {series}"))
    };
    assert_eq!(value("latchkey_watchers"), 4.0);
    assert_eq!(value("latchkey_watch_streams"), 6.0);
    assert_eq!(value("latchkey_watch_events_sent_total"), 9.0);
    assert!(value("latchkey_watch_commit_to_send_seconds_count") >= 1.0);
    assert_eq!(
        value("latchkey_watch_commit_to_send_seconds_bucket{le=\"+Inf\"}"),
        value("latchkey_watch_commit_to_send_seconds_count")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_watches_on_one_stream_each_get_their_own_events() {
    const WATCHES: usize = 1000;
    let cluster = Cluster::start(CELL_BIN, 1, &[]).await;
    let mut client = cluster.client(1).await;
    let mut stream = client.watch("many/0000", None).await.expect("watch stream");
    for i in 1..WATCHES {
        stream
            .watch(format!("many/{i:04}"), None)
            .await
            .expect("add a watch to the stream");
    }
    // Created responses come in request order: watch i is for key i.
    let mut key_of: HashMap<i64, String> = HashMap::new();
    while key_of.len() < WATCHES {
        let resp = next(&mut stream).await;
        assert!(resp.created() && !resp.canceled(), "{resp:?}");
        key_of.insert(resp.watch_id(), format!("many/{:04}", key_of.len()));
    }
    assert_eq!(key_of.len(), WATCHES, "watch ids are distinct");

    // Every key written once, 64 writes in flight.
    put_all(
        &client,
        (0..WATCHES).map(|i| (format!("many/{i:04}"), format!("v{i}"))),
    )
    .await;

    let mut got: HashMap<i64, Vec<String>> = HashMap::new();
    let mut total = 0;
    while total < WATCHES {
        let resp = next(&mut stream).await;
        for (_, key, value, _) in seen(&resp) {
            let i: usize = key["many/".len()..].parse().expect("numbered key");
            assert_eq!(value, format!("v{i}"));
            got.entry(resp.watch_id()).or_default().push(key);
            total += 1;
        }
    }
    for (id, key) in &key_of {
        assert_eq!(got.get(id), Some(&vec![key.clone()]), "watch {id}");
    }
}

/// The watcher's half of a test that also measured writer throughput: the
/// throughput half (writes/s with a stalled watcher >= 0.9 x without) is a
/// load-test scenario now, not a timed test.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watcher_that_stops_reading_during_a_hundred_thousand_writes_then_gets_every_event() {
    const WRITES: usize = 100_000;
    let cluster = Cluster::start(CELL_BIN, 1, &[]).await;
    let writer = cluster.client(1).await;
    let mut watch_client = cluster.client(1).await;

    let first_rev = writer
        .clone()
        .get("none", None)
        .await
        .expect("get")
        .header()
        .expect("header")
        .revision()
        + 1;
    let mut stream = open(
        &mut watch_client,
        "slow/",
        WatchOptions::new().with_prefix(),
    )
    .await;
    // The watcher now reads nothing while 100 000 writes happen, and for
    // at least 10 s: far more than its stream can buffer.
    let paused = Instant::now();
    put_all(&writer, numbered("slow/", WRITES, "0123456789abcdef")).await;
    println!("{WRITES} writes in {:?}", paused.elapsed());
    tokio::time::sleep_until(paused + Duration::from_secs(10)).await;

    // Now it reads: every event since it started, in order, none twice.
    let mut next_rev = first_rev;
    let mut count = 0;
    let started = Instant::now();
    while count < WRITES {
        let resp = next(&mut stream).await;
        assert!(!resp.canceled(), "cancelled instead of caught up: {resp:?}");
        for event in resp.events() {
            let rev = event.kv().expect("kv").mod_revision();
            assert_eq!(rev, next_rev, "events in order with no gap");
            next_rev += 1;
            count += 1;
        }
    }
    println!(
        "the stalled watcher then received all {count} events in {:.1}s",
        started.elapsed().as_secs_f64()
    );
    let slow = cluster
        .metric(1, "latchkey_watch_slow_streams_total")
        .await
        .unwrap_or(0.0);
    assert!(slow >= 1.0, "the lagging stream is counted ({slow})");
}

/// Review P3: a watch from an old revision is sent history a response at a
/// time. Before, the member rebuilt every event in the window (each with
/// its previous value) before sending the first, so one `watch --rev=1` over a
/// large history could take as much memory again as twice the history.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_from_the_first_revision_over_a_large_history_is_sent_it_without_copying_it_all() {
    // 128 MiB of history, in values of the largest size a member takes.
    const WRITES: usize = 2_000;
    const VALUE: usize = 64 * 1024;
    let cluster = Cluster::start(CELL_BIN, 1, &[]).await;
    let writer = cluster.client(1).await;
    let first_rev = put(&mut writer.clone(), "big/start", "x").await + 1;
    put_all(&writer, numbered("big/", WRITES, &"v".repeat(VALUE))).await;
    let pid = cluster.pid(1).expect("the member's pid");
    let before = rss_bytes(pid).expect("the member's RSS");
    let mut watch_client = cluster.client(1).await;
    let mut stream = open(
        &mut watch_client,
        "big/",
        WatchOptions::new()
            .with_prefix()
            .with_start_revision(first_rev),
    )
    .await;
    // The watcher reads nothing for 2 s: whatever the member prepares for
    // it is in its memory now.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let held = rss_bytes(pid)
        .expect("the member's RSS")
        .saturating_sub(before);
    let history = (WRITES * VALUE) as u64;
    println!(
        "history {} MiB; the member holds {} MiB more while the watcher waits",
        history >> 20,
        held >> 20
    );
    assert!(
        held < history / 4,
        "{} MiB more for a watch over {} MiB of history",
        held >> 20,
        history >> 20
    );
    // Then it reads: every write in order, each with its previous value.
    let mut next_rev = first_rev;
    while next_rev < first_rev + WRITES as i64 {
        let resp = next(&mut stream).await;
        assert!(!resp.canceled(), "{resp:?}");
        for event in resp.events() {
            let kv = event.kv().expect("kv");
            assert_eq!(kv.mod_revision(), next_rev, "events in order with no gap");
            assert_eq!(kv.value().len(), VALUE);
            next_rev += 1;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revision_larger_than_a_message_arrives_in_fragments_when_asked() {
    // Responses are limited to the request limit, 64 KiB here.
    let cluster = Cluster::start(CELL_BIN, 1, &["--max-request-bytes", "65536"]).await;
    let mut client = cluster.client(1).await;
    let lease = client.lease_grant(60, None).await.expect("grant").id();
    let big = "x".repeat(10_000);
    for i in 0..10 {
        client
            .put(
                format!("frag/{i}"),
                big.as_str(),
                Some(PutOptions::new().with_lease(lease)),
            )
            .await
            .expect("put");
    }
    let options = WatchOptions::new().with_prefix().with_prev_key();
    let mut whole = open(&mut client, "frag/", options.clone()).await;
    let mut pieces = open(&mut client, "frag/", options.with_fragment()).await;
    // Revoking the lease deletes all ten keys in ONE revision; with their
    // previous values that is ~100 KB of events.
    client.lease_revoke(lease).await.expect("revoke");
    let one = next(&mut whole).await;
    assert_eq!(one.events().len(), 10, "without fragments: one response");
    let mut responses = 0;
    let mut events = Vec::new();
    while events.len() < 10 {
        let resp = next(&mut pieces).await;
        responses += 1;
        events.extend(seen(&resp));
    }
    assert!(
        responses >= 2,
        "100 KB in 64 KiB fragments: {responses} responses"
    );
    let revision = events[0].3;
    assert!(events.iter().all(|e| e.0 == "DELETE" && e.3 == revision));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn automatic_compaction_keeps_the_configured_history() {
    // Revision mode: keep the last 10 revisions (checked every 5 s).
    let by_revision = Cluster::start(
        CELL_BIN,
        1,
        &[
            "--auto-compaction-mode",
            "revision",
            "--auto-compaction-retention",
            "10",
        ],
    )
    .await;
    // Periodic mode: keep the last 2 seconds.
    let by_time = Cluster::start(CELL_BIN, 1, &["--auto-compaction-retention", "2s"]).await;
    for cluster in [&by_revision, &by_time] {
        let mut client = cluster.client(1).await;
        let mut last = 0;
        for i in 0..30 {
            last = put(&mut client, &format!("ac/{i}"), "v").await;
        }
        eventually(Duration::from_secs(15), async || {
            match client
                .get("ac/0", Some(GetOptions::new().with_revision(2)))
                .await
            {
                Err(e) => {
                    assert_eq!(err_text(e), COMPACTED);
                    Ok(())
                }
                Ok(_) => Err("revision 2 still reads: history was never compacted"),
            }
        })
        .await;
        // The retained history still reads.
        let recent = client
            .get("ac/29", Some(GetOptions::new().with_revision(last)))
            .await
            .expect("a recent revision still reads");
        assert_eq!(recent.count(), 1);
    }
    // Revision mode compacted to exactly 10 behind the revision it saw.
    let mut client = by_revision.client(1).await;
    let status = client.status().await.expect("status");
    let revision = status.header().expect("header").revision();
    let err = client
        .get("ac/0", Some(GetOptions::new().with_revision(revision - 11)))
        .await
        .expect_err("compacted");
    assert_eq!(err_text(err), COMPACTED);
    client
        .get("ac/0", Some(GetOptions::new().with_revision(revision - 10)))
        .await
        .expect("the last 10 revisions are kept");
}

const COMPACTED: &str = "OutOfRange: etcdserver: mvcc: required revision has been compacted";
