//! Prints the ToolRun CustomResourceDefinition as YAML:
//! `cargo run -p toolrun-crd --bin crdgen > deploy/crds/toolrun.dev_toolruns.yaml`

fn main() {
    match toolrun_crd::crd_yaml() {
        Ok(yaml) => print!("{yaml}"),
        Err(e) => {
            eprintln!("crdgen: cannot serialise the CRD: {e}");
            std::process::exit(1);
        }
    }
}
