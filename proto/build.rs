fn main() -> Result<(), Box<dyn std::error::Error>> {
    // protoc comes from the protoc-bin-vendored crate, so no system protobuf compiler is needed.
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    let mut config = prost_build::Config::new();
    config.protoc_executable(&protoc);
    tonic_prost_build::configure()
        .file_descriptor_set_path(out.join("toolrun_descriptor.bin"))
        .compile_with_config(config, &["toolrun/v1/toolrun.proto"], &["."])?;
    // The operator's SessionRelay (only the gateway calls it): same package, generated into
    // a directory of its own so the public ToolService's module and descriptor set (served
    // by the gateway's reflection) do not list it.
    let relay_out = out.join("relay");
    std::fs::create_dir_all(&relay_out)?;
    let mut config = prost_build::Config::new();
    config.protoc_executable(&protoc);
    tonic_prost_build::configure()
        .out_dir(&relay_out)
        .file_descriptor_set_path(out.join("relay_descriptor.bin"))
        .compile_with_config(config, &["toolrun/v1/relay.proto"], &["."])?;
    println!("cargo:rerun-if-changed=toolrun/v1/toolrun.proto");
    println!("cargo:rerun-if-changed=toolrun/v1/relay.proto");
    Ok(())
}
