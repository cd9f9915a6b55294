//! Generates the kubelet's gRPC services (server and client) from proto/.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = [
        "proto/dra/v1/api.proto",
        "proto/pluginregistration/v1/api.proto",
    ];
    for p in protos {
        println!("cargo:rerun-if-changed={p}");
    }
    let mut config = tonic_prost_build::Config::new();
    config.protoc_executable(protoc_bin_vendored::protoc_bin_path()?);
    tonic_prost_build::configure().compile_with_config(config, &protos, &["proto"])?;
    Ok(())
}
