//! The sandbox's own duties around the program: live streaming, cancellation, dropped
//! calls, the outer backstop, a broken runner, and what it reports about itself.

mod sandbox_common;

use std::time::{Duration, Instant};

use sandbox_common::*;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use toolrun::config::SandboxConfig;
use toolrun::sandbox::{LocalSandbox, Sandbox, SandboxError};
use toolrun::tool::StreamChunk;
use toolrun_runner::{Language, Verdict};

fn marker() -> String {
    format!(
        "{}",
        100_000_000 + (uuid::Uuid::new_v4().as_u128() % 800_000_000)
    )
}

#[tokio::test]
async fn output_streams_while_the_program_runs() {
    let (tx, mut rx) = mpsc::channel(16);
    let started = Instant::now();
    let run = tokio::spawn(async move {
        sandbox()
            .run(
                spec(
                    Language::Bash,
                    "echo first; sleep 1; echo second >&2",
                    5_000,
                ),
                Some(tx),
                CancellationToken::new(),
            )
            .await
    });
    let first = rx.recv().await.unwrap();
    assert_eq!(first, StreamChunk::Stdout("first\n".into()));
    assert!(
        started.elapsed() < Duration::from_millis(900),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(
        rx.recv().await.unwrap(),
        StreamChunk::Stderr("second\n".into())
    );
    let rec = run.await.unwrap().unwrap();
    assert_eq!(
        (rec.stdout.as_str(), rec.stderr.as_str()),
        ("first\n", "second\n")
    );
}

#[tokio::test]
async fn cancel_kills_the_run() {
    let m = marker();
    let cancel = CancellationToken::new();
    let run = tokio::spawn({
        let cancel = cancel.clone();
        let code = format!("echo up; exec sleep {m}");
        async move {
            sandbox()
                .run(spec(Language::Bash, &code, 20_000), None, cancel)
                .await
        }
    });
    wait_for_marker(&m).await;
    let t = Instant::now();
    cancel.cancel();
    let rec = run.await.unwrap().unwrap();
    assert_eq!(rec.verdict, Verdict::Cancelled, "{rec:?}");
    assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
    assert!(host_processes_with(&m).is_empty());
}

#[tokio::test]
async fn a_dropped_call_leaves_nothing_behind() {
    let m = marker();
    let code = format!("exec sleep {m}");
    // A boxed future: dropping it drops the call.
    let mut call = sandbox().run(
        spec(Language::Bash, &code, 20_000),
        None,
        CancellationToken::new(),
    );
    // Dropped only once its program is seen running on the host.
    tokio::select! {
        rec = &mut call => panic!("the run ended before it was dropped: {rec:?}"),
        () = wait_for_marker(&m) => {}
    }
    drop(call);
    wait_until(
        "the dropped call's program to be killed",
        Duration::from_secs(2),
        || host_processes_with(&m).is_empty(),
    )
    .await;
}

#[test]
fn info_reports_the_mechanisms() {
    let info = sandbox().info();
    assert_eq!(info.backend, "local");
    let active = |name: &str| {
        info.mechanisms
            .iter()
            .find(|m| m.name == name)
            .unwrap_or_else(|| panic!("{name} missing: {info:?}"))
            .active
    };
    for name in [
        "user-namespace",
        "mount-namespace",
        "pid-namespace",
        "network-namespace",
        "ipc-namespace",
        "uts-namespace",
        "cgroup-v1-memory",
        "cgroup-v1-pids",
        "unprivileged-uid",
        "no-new-privs",
        "rlimits",
        "seccomp",
    ] {
        assert!(active(name), "{name} inactive: {info:?}");
    }
    assert!(!active("cgroup-v2"));
}

#[tokio::test]
async fn backstop_and_broken_runner_output() {
    let (sb, _dir) = broken_runner_sandbox();
    let call = |code: &'static str, timeout_ms: u64| {
        sb.run(
            spec(Language::Bash, code, timeout_ms),
            None,
            CancellationToken::new(),
        )
    };

    // A runner that never answers: killed from outside at timeout + 2 s.
    let t = Instant::now();
    let rec = call("FAKE_HANG", 500).await.unwrap();
    assert_eq!(rec.verdict, Verdict::Timeout, "{rec:?}");
    assert!(rec.timed_out);
    assert!(
        t.elapsed() < Duration::from_millis(3_500),
        "{:?}",
        t.elapsed()
    );

    let err = call("FAKE_GARBAGE", 2_000).await.unwrap_err();
    assert!(matches!(err, SandboxError::Protocol(_)), "{err}");
    let err = call("FAKE_NORECORD", 2_000).await.unwrap_err();
    assert!(err.to_string().contains("without a result record"), "{err}");

    // A 100 MB line: refused (the peak memory meanwhile: tests/memory_flat.rs).
    let err = call("FAKE_HUGE", 5_000).await.unwrap_err();
    assert!(err.to_string().contains("longer than"), "{err}");
}

#[tokio::test]
async fn concurrent_runs_all_complete() {
    let runs = (0..6).map(|i| {
        let code = format!("import time\ntime.sleep(0.2)\nprint({i})");
        run_spec(spec(Language::Python, &code, 5_000))
    });
    let recs = futures::future::join_all(runs).await;
    for (i, rec) in recs.iter().enumerate() {
        assert_eq!(
            (rec.verdict, rec.stdout.clone()),
            (Verdict::Ok, format!("{i}\n")),
            "{rec:?}"
        );
    }
}

#[test]
fn host_configuration_cannot_be_mounted() {
    for bad in [
        "/",
        "/etc",
        "/etc/ssl",
        "/root",
        "/home/user",
        "relative/usr",
    ] {
        let config = SandboxConfig {
            readonly_paths: vec!["/usr".into(), bad.into()],
            ..SandboxConfig::default()
        };
        let err = LocalSandbox::new(&config)
            .err()
            .unwrap_or_else(|| panic!("{bad} accepted"));
        assert!(err.to_string().contains("readonly_paths"), "{err}");
    }
}
