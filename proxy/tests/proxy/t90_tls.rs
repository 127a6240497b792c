//! TLS through a proxy, with real processes: a three-member cell with
//! mutual TLS everywhere, a proxy with TLS on its HTTP and gRPC ports and
//! its own certificate towards the cell; curl and etcdctl as a user would
//! run them.

use latchkey_testkit::certs::Certs;
use latchkey_testkit::etcdctl::try_etcdctl;
use latchkey_testkit::{cell_binary, Cluster, ProxyProcess};
use std::path::Path;
use std::process::{Command, Output};

fn curl(args: &[&str]) -> Output {
    Command::new("curl")
        .args(["-sS", "--max-time", "10"])
        .args(args)
        .output()
        .expect("curl runs")
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_and_etcdctl_with_client_certificates_through_a_tls_proxy_to_a_tls_cell() {
    let dir = tempfile::tempdir().expect("temp dir");
    let certs = Certs::make(
        dir.path(),
        &[
            ("member", "IP:127.0.0.1"),
            ("proxy", "IP:127.0.0.1,DNS:localhost"),
            ("alice", "DNS:alice"),
        ],
    );
    let p = |path: &Path| path.to_str().expect("utf-8").to_string();
    let (ca, member, member_key) = (
        p(&certs.ca()),
        p(&certs.cert("member")),
        p(&certs.key("member")),
    );
    let (proxy_cert, proxy_key) = (p(&certs.cert("proxy")), p(&certs.key("proxy")));
    let (alice, alice_key) = (p(&certs.cert("alice")), p(&certs.key("alice")));
    let cell_args = [
        "--cert-file",
        &member,
        "--key-file",
        &member_key,
        "--trusted-ca-file",
        &ca,
        "--client-cert-auth",
        "--peer-cert-file",
        &member,
        "--peer-key-file",
        &member_key,
        "--peer-trusted-ca-file",
        &ca,
    ];
    let cluster = Cluster::start_tls(cell_binary(), 3, &cell_args, certs.client("alice")).await;
    let proxy = ProxyProcess::start(
        latchkey_testkit::proxy::proxy_binary().as_path(),
        &cluster
            .members
            .iter()
            .map(|m| m.client.clone())
            .collect::<Vec<_>>(),
        &[
            "--cert-file",
            &proxy_cert,
            "--key-file",
            &proxy_key,
            "--trusted-ca-file",
            &ca,
            "--client-cert-auth",
            "--cacert",
            &ca,
            "--cert",
            &proxy_cert,
            "--key",
            &proxy_key,
        ],
    )
    .await;

    // curl with the CA and a client certificate writes and reads.
    let url = format!("https://{}/v1/kv/tls-greeting", proxy.http);
    let tls_args = ["--cacert", &ca, "--cert", &alice, "--key", &alice_key];
    let put = curl(
        &[
            &tls_args[..],
            &["-X", "PUT", "--data-binary", "hello", &url],
        ]
        .concat(),
    );
    assert!(put.status.success(), "{}", text(&put));
    let get = curl(&[&tls_args[..], &[url.as_str()]].concat());
    assert!(text(&get).contains("hello"), "{}", text(&get));
    // Without a client certificate, without the CA, or in plain text:
    // refused, at once.
    for (what, args) in [
        ("no client certificate", vec!["--cacert", &ca, &url]),
        ("no CA", vec!["--cert", &alice, "--key", &alice_key, &url]),
    ] {
        let out = curl(&args);
        assert!(!out.status.success(), "{what}: {}", text(&out));
    }
    let plain = curl(&[&format!("http://{}/v1/kv/tls-greeting", proxy.http)]);
    assert!(!plain.status.success(), "plain text: {}", text(&plain));
    assert_ne!(
        plain.status.code(),
        Some(28),
        "plain text hung until curl's timeout"
    );

    // etcdctl with --cacert --cert --key, through the proxy and straight
    // to a member.
    let etcdctl_tls = ["--cacert", &ca, "--cert", &alice, "--key", &alice_key];
    for endpoint in [
        format!("https://{}", proxy.grpc),
        format!(
            "https://{}",
            cluster.member(cluster.leader_at_start()).client
        ),
    ] {
        let put = try_etcdctl(
            &endpoint,
            &[&etcdctl_tls[..], &["put", "tls-key", &endpoint]].concat(),
            None,
        )
        .await;
        assert_eq!(put.as_deref(), Ok("OK\n"), "{endpoint}");
        let get = try_etcdctl(
            &endpoint,
            &[&etcdctl_tls[..], &["get", "tls-key", "--print-value-only"]].concat(),
            None,
        )
        .await
        .unwrap_or_else(|e| panic!("{endpoint}: {e}"));
        assert_eq!(get.trim(), endpoint);
        let anonymous = try_etcdctl(
            &endpoint,
            &["--cacert", &ca, "--command-timeout", "5s", "get", "tls-key"],
            None,
        )
        .await;
        assert!(
            anonymous.is_err(),
            "{endpoint}: etcdctl without a certificate read a key"
        );
    }
}
