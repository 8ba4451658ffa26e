//! Generates the kubelet DRA plugin API (v1) and plugin registration API code with a vendored protoc.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    // SAFETY: build scripts are single-threaded; nothing else reads the environment concurrently.
    unsafe { std::env::set_var("PROTOC", protoc) };
    tonic_prost_build::configure()
        .compile_protos(&["../proto/dra/dra/v1/api.proto"], &["../proto/dra/dra/v1"])?;
    tonic_prost_build::configure().compile_protos(
        &["../proto/dra/pluginregistration/v1/api.proto"],
        &["../proto/dra/pluginregistration/v1"],
    )?;
    println!("cargo:rerun-if-changed=../proto/dra");
    Ok(())
}
