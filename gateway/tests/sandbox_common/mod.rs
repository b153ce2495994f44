//! Shared helpers of the sandbox tests: one LocalSandbox per test binary, specs, runs.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::sync::OnceLock;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use toolrun::config::{Limits, SandboxConfig};
use toolrun::sandbox::{LocalSandbox, Sandbox, SandboxRun};
use toolrun_runner::{Language, RunRecord, RunSpec, Verdict};

pub const PYTHON: &str = "/usr/bin/python3";
pub const NODE: &str = "/usr/bin/node";
pub const BASH: &str = "/bin/bash";

/// The sandbox under test. Builds `toolrun-runner` first when `cargo test` has not.
pub fn sandbox() -> &'static LocalSandbox {
    static SANDBOX: OnceLock<LocalSandbox> = OnceLock::new();
    SANDBOX.get_or_init(|| {
        ensure_runner_built();
        LocalSandbox::new(&SandboxConfig::default())
            .expect("local sandbox must start (run as root)")
    })
}

pub fn ensure_runner_built() {
    let exe = std::env::current_exe().unwrap();
    let profile_dir = exe.parent().unwrap().parent().unwrap();
    if profile_dir.join("toolrun-runner").is_file() {
        return;
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = std::process::Command::new(cargo)
        .args(["build", "-p", "toolrun-runner"])
        .status()
        .expect("cargo build -p toolrun-runner");
    assert!(status.success());
}

/// A run with the default limits and the given program.
pub fn spec(language: Language, code: &str, timeout_ms: u64) -> SandboxRun {
    let limits = Limits::default();
    let interpreter = match language {
        Language::Python => PYTHON,
        Language::Javascript => NODE,
        Language::Bash => BASH,
        Language::Exec => "/bin/cat",
    };
    SandboxRun {
        language: language.as_str().into(),
        spec: RunSpec {
            language,
            code: code.to_string(),
            args: Vec::new(),
            env: BTreeMap::from([("PATH".to_string(), "/usr/bin:/bin".to_string())]),
            stdin: String::new(),
            interpreter: interpreter.to_string(),
            workdir: "/tmp".to_string(),
            limits: toolrun::sandbox::runner_limits(&limits, timeout_ms),
            setup: Default::default(),
        },
        limits,
        tool: "run_code".into(),
        call_id: "test".into(),
        tenant: String::new(),
        workspace: None,
        session: None,
        image: None,
    }
}

pub async fn run_spec(run: SandboxRun) -> RunRecord {
    sandbox()
        .run(run, None, CancellationToken::new())
        .await
        .expect("sandbox run")
}

pub async fn py(code: &str) -> RunRecord {
    run_spec(spec(Language::Python, code, 3_000)).await
}

pub async fn bash(code: &str) -> RunRecord {
    run_spec(spec(Language::Bash, code, 3_000)).await
}

/// Asserts that the run ended on time with a non-OK verdict.
pub fn assert_stopped(rec: &RunRecord, elapsed: Duration, budget: Duration) {
    assert_ne!(rec.verdict, Verdict::Ok, "{rec:?}");
    assert!(elapsed <= budget, "took {elapsed:?} > {budget:?}: {rec:?}");
}

/// Host processes whose command line contains `marker`.
pub fn host_processes_with(marker: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        if !entry
            .file_name()
            .to_string_lossy()
            .chars()
            .all(|c| c.is_ascii_digit())
        {
            continue;
        }
        if let Ok(cmd) = std::fs::read(entry.path().join("cmdline")) {
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            if cmd.contains(marker) {
                found.push(format!("{}: {cmd}", entry.file_name().to_string_lossy()));
            }
        }
    }
    found
}

/// Polls `f` every 20 ms until it holds; fails the test after `deadline` naming `what`.
pub async fn wait_until(what: &str, deadline: Duration, mut f: impl FnMut() -> bool) {
    let end = std::time::Instant::now() + deadline;
    while !f() {
        assert!(
            std::time::Instant::now() < end,
            "timed out after {deadline:?} waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Runs `code` with the host's python3, outside any sandbox (the control of a test that
/// shows the sandbox blocks something), and returns its stdout.
pub fn host_python(code: &str) -> String {
    let out = std::process::Command::new(PYTHON)
        .args(["-c", code])
        .output()
        .expect("host python3 runs");
    assert!(out.status.success(), "host python3 failed: {out:?}");
    String::from_utf8(out.stdout).unwrap()
}

/// Waits (up to 15 s, for loaded machines) until a host process carries `marker`.
pub async fn wait_for_marker(marker: &str) {
    let end = std::time::Instant::now() + Duration::from_secs(15);
    while host_processes_with(marker).is_empty() {
        assert!(
            std::time::Instant::now() < end,
            "no process with marker {marker} appeared"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A sandbox whose "runner" is a script misbehaving on request (the spec's code says how):
/// FAKE_HANG, FAKE_GARBAGE, FAKE_HUGE (one 100 MB line), FAKE_NORECORD; otherwise a plain
/// record (the startup probes).
pub fn broken_runner_sandbox() -> (LocalSandbox, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let script = dir.path().join("fake-runner");
    std::fs::write(
        &script,
        r#"#!/bin/bash
spec=$(cat)
case "$spec" in
  *FAKE_HANG*) exec sleep 1000 ;;
  *FAKE_GARBAGE*) echo 'not json' ;;
  *FAKE_HUGE*) head -c 100000000 /dev/zero | tr '\0' a ;;
  *FAKE_NORECORD*) echo '{"event":"stdout","data":"partial"}' ;;
  *) echo '{"event":"result","version":1,"verdict":"OK","exit_code":0,"signal":null,"stdout":"","stderr":"","stdout_truncated":false,"stderr_truncated":false,"timed_out":false,"duration_ms":0,"message":""}' ;;
esac
"#,
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let config = SandboxConfig {
        runner_path: Some(script),
        ..SandboxConfig::default()
    };
    (LocalSandbox::new(&config).unwrap(), dir)
}
