//! Generates the ckf.v1 messages, clients and servers with tonic-prost-build, using the
//! vendored `protoc` so a fresh machine needs no system protobuf compiler. Also writes the
//! encoded file descriptor set that gRPC server reflection serves.

use std::{env, path::PathBuf};

const PROTOS: &[&str] = &[
    "ckf/v1/common.proto",
    "ckf/v1/ingest.proto",
    "ckf/v1/relay.proto",
    "ckf/v1/query.proto",
    "ckf/v1/admin.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // SAFETY (of intent): build scripts are single-threaded; setting PROTOC here only affects
    // this process and the protoc invocations below.
    unsafe { env::set_var("PROTOC", protoc_bin_vendored::protoc_bin_path()?) };
    let out_dir = PathBuf::from(env::var("OUT_DIR")?);
    tonic_prost_build::configure()
        .file_descriptor_set_path(out_dir.join("ckf_v1_descriptor.bin"))
        // Hand-written with a bulk decoder of its packed hashes (src/block_hashes.rs).
        .extern_path(
            ".ckf.v1.BlockHashQuery",
            "crate::block_hashes::BlockHashQuery",
        )
        .compile_protos(PROTOS, &["."])?;
    for proto in PROTOS {
        println!("cargo:rerun-if-changed={proto}");
    }
    Ok(())
}
