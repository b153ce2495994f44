fn main() -> Result<(), Box<dyn std::error::Error>> {
    // protoc comes from the protoc-bin-vendored crate, so no system protobuf compiler is needed.
    let mut config = prost_build::Config::new();
    config.protoc_executable(protoc_bin_vendored::protoc_bin_path()?);
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    tonic_prost_build::configure()
        .file_descriptor_set_path(out.join("toolrun_descriptor.bin"))
        .compile_with_config(config, &["toolrun/v1/toolrun.proto"], &["."])?;
    println!("cargo:rerun-if-changed=toolrun/v1/toolrun.proto");
    Ok(())
}
