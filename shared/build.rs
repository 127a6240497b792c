fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        // etcd's own message types come from the etcd-client crate.
        .extern_path(
            ".etcdserverpb.ResponseHeader",
            "::etcd_client::proto::PbResponseHeader",
        )
        .extern_path(".mvccpb.KeyValue", "::etcd_client::proto::PbKeyValue")
        .compile_protos(
            &[
                "proto/peer.proto",
                "proto/sessions.proto",
                "proto/v3lock.proto",
                "proto/v3election.proto",
                "proto/auth.proto",
                "proto/tenants.proto",
                "proto/proxy_auth.proto",
                "proto/moves.proto",
            ],
            &["proto"],
        )?;
    Ok(())
}
