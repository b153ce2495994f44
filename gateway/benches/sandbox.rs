//! Sandbox overhead: `print(1)` in Python through [`LocalSandbox`] against bare
//! `python3 -c 'print(1)'`, in the same run. Needs root (like the sandbox tests).
//!
//! Run: `cargo bench -p toolrun --bench sandbox -- --warm-up-time 2 --measurement-time 10`
//! (criterion prints the mean; `target/criterion/python_print_1/*/new/estimates.json` hold
//! the medians). `bare_python3` and `local_sandbox` are back-to-back loops (the sandbox
//! loop also prepares each next sandbox while a run executes); `overhead_interleaved`
//! alternates one bare run and one sandboxed run and measures their difference, the
//! latency a single call adds.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use tokio_util::sync::CancellationToken;
use toolrun::config::{Limits, SandboxConfig};
use toolrun::sandbox::{LocalSandbox, Sandbox, SandboxRun, runner_limits};
use toolrun_runner::{Language, RunSpec, Verdict};

const PYTHON: &str = "/usr/bin/python3";

fn print_one() -> SandboxRun {
    let limits = Limits::default();
    SandboxRun {
        language: "python".into(),
        spec: RunSpec {
            language: Language::Python,
            code: "print(1)".into(),
            args: Vec::new(),
            env: BTreeMap::new(),
            stdin: String::new(),
            interpreter: PYTHON.into(),
            workdir: "/tmp".into(),
            limits: runner_limits(&limits, 5_000),
            setup: Default::default(),
        },
        limits,
        tool: "run_code".into(),
        call_id: "bench".into(),
        tenant: String::new(),
        workspace: None,
        session: None,
        image: None,
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
    let sandbox = &sandbox;
    group.bench_function("local_sandbox", |b| {
        b.to_async(&rt).iter(|| async {
            let rec = sandbox
                .run(print_one(), None, CancellationToken::new())
                .await
                .unwrap();
            assert_eq!((rec.verdict, rec.stdout.as_str()), (Verdict::Ok, "1\n"));
        })
    });
    // The two above run one after the other, so a load change on a shared machine skews
    // their difference; this one alternates them and measures the difference directly
    // (a sample where the sandbox was not slower counts as 1 µs, so it errs high).
    group.bench_function("overhead_interleaved", |b| {
        b.to_async(&rt).iter_custom(|iters| async move {
            let mut overhead = Duration::ZERO;
            for _ in 0..iters {
                let t = Instant::now();
                let out = Command::new(PYTHON)
                    .args(["-c", "print(1)"])
                    .output()
                    .unwrap();
                let bare = t.elapsed();
                assert_eq!(out.stdout, b"1\n");
                let t = Instant::now();
                let rec = sandbox
                    .run(print_one(), None, CancellationToken::new())
                    .await
                    .unwrap();
                overhead += t.elapsed().saturating_sub(bare);
                assert_eq!(rec.verdict, Verdict::Ok);
            }
            overhead.max(Duration::from_micros(1))
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
