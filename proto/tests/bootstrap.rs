//! The generated protobuf and gRPC code is checked in, so that building Herald
//! needs no `protoc` and no build script. This test regenerates it with a
//! vendored `protoc` and fails on any difference. Run with `HERALD_BLESS=1` to
//! write the new code instead.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed expectation is the failure

use std::path::Path;

#[test]
fn generated_code_matches_the_proto_files() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = std::env::temp_dir().join(format!("herald-proto-{}", std::process::id()));
    std::fs::create_dir_all(&out).expect("temp dir");
    let protoc = protoc_bin_vendored::protoc_bin_path().expect("vendored protoc");
    let mut prost = tonic_prost_build::Config::new();
    prost.protoc_executable(protoc);
    // The messages, the `Publisher` and `ProxyBackend` servers and clients over any channel
    // (`build_transport(false)`: the client needs no tonic transport, and the
    // tests bring their own).
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .build_transport(false)
        .out_dir(&out)
        .compile_with_config(
            prost,
            &[
                root.join("proto/herald/v1/herald.proto"),
                root.join("proto/herald/v1/hooks.proto"),
            ],
            &[root.join("proto")],
        )
        .expect("protoc compiles herald.proto and hooks.proto");

    let fresh = std::fs::read_to_string(out.join("herald.v1.rs")).expect("generated file");
    let _ = std::fs::remove_dir_all(&out);
    let checked_in_path = root.join("src/gen/herald.v1.rs");
    if std::env::var_os("HERALD_BLESS").is_some() {
        std::fs::write(&checked_in_path, &fresh).expect("write generated code");
        return;
    }
    let checked_in = std::fs::read_to_string(&checked_in_path).unwrap_or_default();
    assert!(
        checked_in == fresh,
        "src/gen/herald.v1.rs is stale: run `HERALD_BLESS=1 cargo test -p herald-proto --test bootstrap`"
    );
}
