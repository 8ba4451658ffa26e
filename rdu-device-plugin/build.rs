//! Generates the kubelet device plugin API (v1beta1) and pod-resources API (v1) code with a vendored protoc.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    // SAFETY: build scripts are single-threaded; nothing else reads the environment concurrently.
    unsafe { std::env::set_var("PROTOC", protoc) };
    tonic_prost_build::configure().compile_protos(
        &["../proto/deviceplugin/v1beta1/api.proto"],
        &["../proto/deviceplugin/v1beta1"],
    )?;
    tonic_prost_build::configure().compile_protos(
        &["../proto/deviceplugin/podresources/v1/api.proto"],
        &["../proto/deviceplugin/podresources/v1"],
    )?;
    println!("cargo:rerun-if-changed=../proto/deviceplugin");
    Ok(())
}
