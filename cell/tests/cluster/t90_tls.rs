//! TLS with real member processes: every listener on TLS, mutual TLS
//! between members with names checked against the membership, plain text
//! refused without a hang, and a certificate replaced on disk in use
//! without a restart.

use crate::CELL_BIN;
use etcd_client::{Certificate, Client, ConnectOptions, Identity, TlsOptions};
use latchkey_cell::raft::network::PeerChannels;
use latchkey_cell::raft::{NodeId, TypeConfig};
use latchkey_cell::storage::codec::encode;
use latchkey_shared::tls::{ClientFiles, ClientTls};
use latchkey_testkit::certs::Certs;
use latchkey_testkit::eventually::eventually;
use latchkey_testkit::Cluster;
use openraft::raft::{AppendEntriesRequest, VoteRequest};
use openraft::{CommittedLeaderId, LogId, Vote};
use std::path::Path;
use std::time::Duration;

/// How long a refused client may take to hear so: a refusal, not a hang.
const REFUSED_WITHIN: Duration = Duration::from_secs(10);

fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Copies `from` over `to` in one rename, as cert-manager's symlink swap.
fn replace(from: &Path, to: &Path) {
    let tmp = to.with_extension("new");
    std::fs::copy(from, &tmp).expect("copy");
    std::fs::rename(&tmp, to).expect("rename");
}

/// A client of member `addr` with `tls`, asked for one key; the error it
/// got, within [`REFUSED_WITHIN`].
async fn refused(url: &str, tls: Option<TlsOptions>) -> String {
    let attempt = async {
        let mut opts = ConnectOptions::new()
            .with_timeout(Duration::from_secs(5))
            .with_connect_timeout(Duration::from_secs(5));
        if let Some(tls) = tls {
            opts = opts.with_tls(tls);
        }
        let mut client = Client::connect([url], Some(opts)).await?;
        client.get("k", None).await
    };
    match tokio::time::timeout(REFUSED_WITHIN, attempt).await {
        Ok(Ok(_)) => panic!("{url}: a client that should be refused read a key"),
        Ok(Err(e)) => e.to_string(),
        Err(_) => panic!("{url}: no answer within {REFUSED_WITHIN:?}: a hang, not a refusal"),
    }
}

/// A would-be member dialling peers with `files`.
fn rogue(cluster_id: u64, files: ClientFiles) -> PeerChannels {
    let tls = ClientTls::load("rogue", &files).expect("rogue TLS");
    PeerChannels::new(cluster_id, "127.0.0.1:0".parse().expect("addr"), Some(tls))
}

/// A vote for node 99 at term 1000 with a log far ahead of the cell's,
/// and a heartbeat from it as leader: granted or taken, either moves the
/// member to term 1000.
async fn campaign(peers: &PeerChannels, addr: &str) -> Vec<tonic::Status> {
    let vote = Vote::new(1000, 99);
    let last = LogId::new(CommittedLeaderId::new(999, 99), 1_000_000);
    let vote_req: VoteRequest<NodeId> = VoteRequest::new(vote, Some(last));
    let append: AppendEntriesRequest<TypeConfig> = AppendEntriesRequest {
        vote: Vote::new_committed(1000, 99),
        prev_log_id: None,
        entries: vec![],
        leader_commit: None,
    };
    let mut refusals = Vec::new();
    let mut client = peers.get(addr).expect("peer client");
    let timeout = Duration::from_secs(5);
    let request = peers.request(encode(&vote_req).expect("encode"), timeout);
    match client.vote(request).await {
        Ok(_) => panic!("{addr} took a vote from a stranger"),
        Err(status) => refusals.push(status),
    }
    let request = peers.request(encode(&append).expect("encode"), timeout);
    match client.append_entries(request).await {
        Ok(_) => panic!("{addr} took entries from a stranger"),
        Err(status) => refusals.push(status),
    }
    refusals
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_on_every_listener_and_peers_only_from_members_of_the_cells_ca() {
    let dir = tempfile::tempdir().expect("temp dir");
    let cell_ca = Certs::make(
        &dir.path().join("cell"),
        &[
            ("member", "IP:127.0.0.1"),
            ("alice", "DNS:alice"),
            ("stranger", "IP:127.0.0.99"),
            ("impostor", "IP:127.0.0.77"),
        ],
    );
    let other_ca = Certs::make(&dir.path().join("other"), &[("member", "IP:127.0.0.1")]);
    let rotated_ca = Certs::make(&dir.path().join("rotated"), &[("member", "IP:127.0.0.1")]);
    // The client port's own copy, replaced on disk below.
    let (client_cert, client_key) = (
        dir.path().join("client.pem"),
        dir.path().join("client-key.pem"),
    );
    replace(&cell_ca.cert("member"), &client_cert);
    replace(&cell_ca.key("member"), &client_key);
    let path = |p: &Path| p.to_str().expect("utf-8").to_string();
    let args = [
        "--cert-file".to_string(),
        path(&client_cert),
        "--key-file".into(),
        path(&client_key),
        "--trusted-ca-file".into(),
        path(&cell_ca.ca()),
        "--client-cert-auth".into(),
        "--metrics-tls".into(),
        "--peer-cert-file".into(),
        path(&cell_ca.cert("member")),
        "--peer-key-file".into(),
        path(&cell_ca.key("member")),
        "--peer-trusted-ca-file".into(),
        path(&cell_ca.ca()),
    ];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut cluster = Cluster::start_tls(CELL_BIN, 3, &args, cell_ca.client("alice")).await;

    // Mutual TLS among the members elected a leader; a client with the
    // cell's CA and a certificate it signed writes and reads.
    let leader = cluster.leader_at_start();
    let mut client = cluster.client(leader).await;
    client.put("k", "v", None).await.expect("put over TLS");
    let status = client.status().await.expect("status");
    let term = status.raft_term();
    let cluster_id = status.header().expect("header").cluster_id();
    let url = cluster.url(leader);
    let member = cluster.member(leader).clone();

    // The client port refuses a client without a certificate, with one
    // of another CA, and plain text; each hears so at once.
    let trust_cell =
        || TlsOptions::new().ca_certificate(Certificate::from_pem(read(&cell_ca.ca())));
    for (what, tls) in [
        ("no certificate", trust_cell()),
        (
            "another CA's certificate",
            trust_cell().identity(Identity::from_pem(
                read(&other_ca.cert("member")),
                read(&other_ca.key("member")),
            )),
        ),
    ] {
        let why = refused(&url, Some(tls)).await;
        println!("client port, {what}: {why}");
    }
    let why = refused(&format!("http://{}", member.client), None).await;
    println!("client port, plain text: {why}");

    // The peer port: another CA's certificate, no certificate, or the
    // cell's CA for a name that is no member's; none moves the term.
    let other = rogue(
        cluster_id,
        ClientFiles {
            trusted_ca: cell_ca.ca(),
            cert_and_key: Some((other_ca.cert("member"), other_ca.key("member"))),
        },
    );
    let anonymous = rogue(
        cluster_id,
        ClientFiles {
            trusted_ca: cell_ca.ca(),
            cert_and_key: None,
        },
    );
    let stranger = rogue(
        cluster_id,
        ClientFiles {
            trusted_ca: cell_ca.ca(),
            cert_and_key: Some((cell_ca.cert("stranger"), cell_ca.key("stranger"))),
        },
    );
    for (what, peers) in [("another CA", &other), ("no certificate", &anonymous)] {
        for status in campaign(peers, &member.peer).await {
            assert_ne!(
                status.code(),
                tonic::Code::PermissionDenied,
                "{what}: refused in the handshake, before any request: {status:?}"
            );
        }
    }
    for status in campaign(&stranger, &member.peer).await {
        assert_eq!(status.code(), tonic::Code::PermissionDenied, "{status:?}");
        assert!(status.message().contains("names no member"), "{status:?}");
    }
    let status = client.status().await.expect("status");
    assert_eq!(status.raft_term(), term, "a stranger moved the term");
    assert_eq!(cluster.leader_seen_by(leader).await, Some(leader));
    client
        .put("k", "v2", None)
        .await
        .expect("the cell keeps serving");

    // A member joins with `--join https://...`: it finds its id over the
    // client ports' TLS, and the leader replicates to it over peer TLS.
    let peer4 = format!("127.0.0.1:{}", latchkey_testkit::free_port());
    let added = client
        .member_add(
            [format!("http://{peer4}")],
            Some(etcd_client::MemberAddOptions::new().with_is_learner()),
        )
        .await
        .expect("member add");
    let id4 = added.member().expect("the new member").id();
    cluster.new_joiner(id4, peer4);
    cluster.spawn(id4);
    let mut learner = cluster.client(id4).await;
    eventually(Duration::from_secs(30), async || {
        let got = learner
            .get(
                "k",
                Some(etcd_client::GetOptions::new().with_serializable()),
            )
            .await
            .map_err(|e| e.to_string())?;
        match got.kvs().first().map(|kv| kv.value()) {
            Some(b"v2") => Ok(()),
            other => Err(format!("the joiner has {other:?}")),
        }
    })
    .await;

    // A member added at 127.0.0.99 that starts with a certificate of the
    // cell's CA for another name (127.0.0.77) finds its id, but the leader
    // never replicates to it: the certificate it serves does not name the
    // address the leader dials, and its own requests name no member.
    let peer5 = format!("127.0.0.99:{}", latchkey_testkit::free_port());
    let added = client
        .member_add(
            [format!("https://{peer5}")],
            Some(etcd_client::MemberAddOptions::new().with_is_learner()),
        )
        .await
        .expect("member add");
    let id5 = added.member().expect("the new member").id();
    let impostor_args: Vec<String> = args
        .iter()
        .map(|a| {
            if *a == path(&cell_ca.cert("member")) {
                path(&cell_ca.cert("impostor"))
            } else if *a == path(&cell_ca.key("member")) {
                path(&cell_ca.key("impostor"))
            } else {
                a.to_string()
            }
        })
        .collect();
    cluster.set_extra_args(&impostor_args.iter().map(String::as_str).collect::<Vec<_>>());
    cluster.new_joiner(id5, peer5);
    cluster.spawn(id5);
    tokio::time::sleep(Duration::from_secs(5)).await;
    let mut impostor = cluster.client(id5).await;
    let got = impostor
        .get(
            "k",
            Some(etcd_client::GetOptions::new().with_serializable()),
        )
        .await;
    assert!(
        got.as_ref().map_or(true, |g| g.kvs().is_empty()),
        "a member serving a certificate for another name was replicated to: {got:?}"
    );
    client
        .put("k", "v3", None)
        .await
        .expect("the cell keeps serving");

    // The metrics port speaks TLS with the same certificate (asking for
    // none: probes and scrapers need only the CA).
    let metrics = |ca: Option<&Path>| {
        let mut curl = std::process::Command::new("curl");
        curl.args([
            "-sS",
            "--max-time",
            "5",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
        ]);
        if let Some(ca) = ca {
            curl.arg("--cacert").arg(ca);
        }
        curl.arg(format!("https://{}/metrics", member.metrics))
            .output()
            .expect("curl")
    };
    let ok = metrics(Some(&cell_ca.ca()));
    assert_eq!(String::from_utf8_lossy(&ok.stdout), "200", "{ok:?}");
    let untrusted = metrics(None);
    assert!(
        !untrusted.status.success(),
        "curl trusted a test CA it was not given"
    );

    // A certificate of another CA replaces the client port's on disk: new
    // connections get it within 10 s, without a restart.
    let rotated = || {
        TlsOptions::new()
            .ca_certificate(Certificate::from_pem(read(&rotated_ca.ca())))
            .identity(Identity::from_pem(
                read(&cell_ca.cert("alice")),
                read(&cell_ca.key("alice")),
            ))
    };
    refused(&url, Some(rotated())).await;
    replace(&rotated_ca.key("member"), &client_key);
    replace(&rotated_ca.cert("member"), &client_cert);
    eventually(Duration::from_secs(10), async || {
        let opts = ConnectOptions::new()
            .with_timeout(Duration::from_secs(2))
            .with_connect_timeout(Duration::from_secs(2))
            .with_tls(rotated());
        let mut c = Client::connect([url.as_str()], Some(opts))
            .await
            .map_err(|e| e.to_string())?;
        c.get("k", None).await.map_err(|e| e.to_string())
    })
    .await;
}
