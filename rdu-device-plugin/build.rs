//! Generates the kubelet device plugin API (v1beta1) client and server with a vendored protoc.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    // SAFETY: build scripts are single-threaded; nothing else reads the environment concurrently.
    unsafe { std::env::set_var("PROTOC", protoc) };
    tonic_prost_build::configure().compile_protos(
        &["../proto/deviceplugin/v1beta1/api.proto"],
        &["../proto/deviceplugin/v1beta1"],
    )?;
    println!("cargo:rerun-if-changed=../proto/deviceplugin/v1beta1/api.proto");
    Ok(())
}
