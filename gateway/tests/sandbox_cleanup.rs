//! After runs of every kind, nothing of them is left on the host: no process, no cgroup.
//! (Its own test binary: other tests running in parallel would hold groups of their own.)

mod sandbox_common;

use std::time::Duration;

use sandbox_common::*;
use toolrun_runner::{Language, Verdict};

fn our_groups() -> Vec<String> {
    let prefix = format!("{}-", std::process::id());
    let mut found = Vec::new();
    for ctrl in ["memory", "pids"] {
        if let Ok(entries) = std::fs::read_dir(format!("/sys/fs/cgroup/{ctrl}/toolrun")) {
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if name.starts_with(&prefix) {
                    found.push(format!("{ctrl}/{name}"));
                }
            }
        }
    }
    found
}

#[tokio::test]
async fn runs_leave_no_processes_or_cgroups() {
    let m = 400_000_000 + std::process::id();
    let runs = [
        spec(
            Language::Bash,
            &format!("(setsid sleep {m} &); echo ok"),
            2_000,
        ),
        spec(Language::Bash, &format!("sleep {m}"), 500),
        spec(Language::Python, "x = 'x' * (1 << 30)", 3_000),
        spec(Language::Bash, ":(){ :|:& };:; sleep 5", 1_000),
    ];
    for run in runs {
        let rec = run_spec(run).await;
        assert_ne!(rec.verdict, Verdict::InfraError, "{rec:?}");
    }
    // The one prepared sandbox waiting for the next run has its memory and pids group.
    wait_until(
        "no process of the runs and at most the prepared sandbox's groups",
        Duration::from_secs(5),
        || host_processes_with(&m.to_string()).is_empty() && our_groups().len() <= 2,
    )
    .await;
}
