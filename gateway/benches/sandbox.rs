//! Sandbox overhead: `print(1)` in Python through [`LocalSandbox`] against bare
//! `python3 -c 'print(1)'`, in the same run. Needs root (like the sandbox tests).
//!
//! Run: `cargo bench -p toolrun --bench sandbox -- --warm-up-time 2 --measurement-time 10`
//! (criterion prints the mean; the estimates in `target/criterion/*/new/estimates.json`
//! include the median, the p50 quoted in the README).

use std::collections::BTreeMap;
use std::process::Command;

use criterion::{Criterion, criterion_group, criterion_main};
use tokio_util::sync::CancellationToken;
use toolrun::config::{Limits, SandboxConfig};
use toolrun::sandbox::{LocalSandbox, Sandbox, SandboxRun, runner_limits};
use toolrun_runner::{Language, RunSpec, Verdict};

const PYTHON: &str = "/usr/bin/python3";

fn print_one() -> SandboxRun {
    let limits = Limits::default();
    SandboxRun {
        spec: RunSpec {
            language: Language::Python,
            code: "print(1)".into(),
            args: Vec::new(),
            env: BTreeMap::new(),
            stdin: String::new(),
            interpreter: PYTHON.into(),
            workdir: "/tmp".into(),
            limits: runner_limits(&limits, 5_000),
        },
        limits,
    }
}

/// Builds `toolrun-runner` in this profile when `cargo bench` has not.
fn ensure_runner_built() {
    let exe = std::env::current_exe().unwrap();
    let profile_dir = exe.parent().unwrap().parent().unwrap();
    if profile_dir.join("toolrun-runner").is_file() {
        return;
    }
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.args(["build", "-p", "toolrun-runner"]);
    if profile_dir.ends_with("release") {
        cmd.arg("--release");
    }
    assert!(cmd.status().unwrap().success());
}

fn bench(c: &mut Criterion) {
    ensure_runner_built();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let sandbox = LocalSandbox::new(&SandboxConfig::default()).expect("local sandbox (root)");
    let mut group = c.benchmark_group("python_print_1");
    group.sample_size(100);
    group.bench_function("bare_python3", |b| {
        b.iter(|| {
            let out = Command::new(PYTHON)
                .args(["-c", "print(1)"])
                .output()
                .unwrap();
            assert_eq!(out.stdout, b"1\n");
        })
    });
    group.bench_function("local_sandbox", |b| {
        b.to_async(&rt).iter(|| async {
            let rec = sandbox
                .run(print_one(), None, CancellationToken::new())
                .await
                .unwrap();
            assert_eq!((rec.verdict, rec.stdout.as_str()), (Verdict::Ok, "1\n"));
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
