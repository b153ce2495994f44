//! `toolrun-runner install DEST`, as the operator's init container runs it: the copy is
//! a working runner.

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};

use toolrun_runner::{Event, Verdict};

const RUNNER: &str = env!("CARGO_BIN_EXE_toolrun-runner");

#[test]
fn installed_copy_runs_as_the_runner() {
    let dir = std::env::temp_dir().join(format!("toolrun-install-it-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let dest = dir.join("toolrun-runner");
    let out = Command::new(RUNNER)
        .args(["install", dest.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success(), "install failed: {out:?}");
    assert!(out.stdout.is_empty());
    assert_eq!(
        std::fs::metadata(&dest).unwrap().permissions().mode() & 0o7777,
        0o755
    );
    assert_eq!(
        std::fs::read(&dest).unwrap(),
        std::fs::read(RUNNER).unwrap()
    );

    // The copy speaks the protocol: a bad spec on stdin gives one INFRA_ERROR record.
    let mut child = Command::new(&dest)
        .args(["--spec", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"{not json").unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let line = String::from_utf8(out.stdout).unwrap();
    match Event::parse(line.trim_end()).unwrap() {
        Event::Result(r) => assert_eq!(r.verdict, Verdict::InfraError),
        other => panic!("expected a result, got {other:?}"),
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn install_without_destination_is_a_usage_error() {
    let out = Command::new(RUNNER).arg("install").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("usage"));
}
