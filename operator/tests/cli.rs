//! The `toolrun-operator` binary's flags and its refusal of a bad configuration file.

use std::process::Command;

fn operator() -> Command {
    Command::new(env!("CARGO_BIN_EXE_toolrun-operator"))
}

#[test]
fn help_lists_the_contract_flags() {
    let out = operator().arg("--help").output().unwrap();
    assert!(out.status.success());
    let help = String::from_utf8(out.stdout).unwrap();
    for flag in ["--config", "--metrics-listen", "--log-format"] {
        assert!(help.contains(flag), "{flag} missing from\n{help}");
    }
}

#[test]
fn a_bad_config_file_fails_at_start_naming_the_key() {
    let dir = std::env::temp_dir().join(format!("toolrun-operator-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("operator.yaml");
    std::fs::write(
        &path,
        "controller:\n  leaderElection:\n    leaseDuration: 5\n",
    )
    .unwrap();
    let out = operator()
        .arg("--config")
        .arg(&path)
        // No cluster is needed to refuse the file.
        .env("KUBECONFIG", dir.join("none"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("controller.leaderElection.leaseDuration: ") && err.contains("unknown field"),
        "{err}"
    );
    std::fs::write(&path, "controller: {apiQps: 0}\n").unwrap();
    let out = operator().arg("--config").arg(&path).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("controller.apiQps: must be at least 1"),
        "{err}"
    );
    let out = operator().args(["--log-format", "xml"]).output().unwrap();
    assert!(!out.status.success());
    std::fs::remove_dir_all(&dir).unwrap();
}
