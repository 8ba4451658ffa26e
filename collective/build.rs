//! Generates the gRPC code of `proto/collective/v1/collective.proto` with a vendored protoc.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    // SAFETY: build scripts are single-threaded; nothing else reads the environment concurrently.
    unsafe { std::env::set_var("PROTOC", protoc) };
    tonic_prost_build::configure()
        .bytes(".rdu.collective.v1.Chunk.payload")
        .compile_protos(
            &["../proto/collective/v1/collective.proto"],
            &["../proto/collective/v1"],
        )?;
    Ok(())
}
