//! Prints a CustomResourceDefinition as YAML:
//! `cargo run -p toolrun-crd --bin crdgen > deploy/crds/toolrun.dev_toolruns.yaml` and
//! `cargo run -p toolrun-crd --bin crdgen tools > deploy/crds/toolrun.dev_tools.yaml` and
//! `cargo run -p toolrun-crd --bin crdgen sessions > deploy/crds/toolrun.dev_toolsessions.yaml`

fn main() {
    let which = std::env::args().nth(1).unwrap_or_else(|| "toolruns".into());
    let yaml = match which.as_str() {
        "toolruns" => toolrun_crd::crd_yaml(),
        "tools" => toolrun_crd::tool_crd_yaml(),
        "sessions" => toolrun_crd::session_crd_yaml(),
        other => {
            eprintln!("crdgen: unknown CRD {other:?} (toolruns, tools or sessions)");
            std::process::exit(2);
        }
    };
    match yaml {
        Ok(yaml) => print!("{yaml}"),
        Err(e) => {
            eprintln!("crdgen: cannot serialise the CRD: {e}");
            std::process::exit(1);
        }
    }
}
