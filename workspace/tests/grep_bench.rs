//! grep's speed against ripgrep on a tree of 10,000 files. Not a correctness test: run it by
//! hand, in release mode, and copy the figures into workspace/README.md:
//!
//! ```text
//! cargo test --release -p toolrun-workspace --test grep_bench -- --ignored --nocapture
//! ```

use std::fs;
use std::process::Command;
use std::time::{Duration, Instant};

use toolrun_workspace::{GrepArgs, Workspace, WorkspaceLimits};

const RUNS: u32 = 5;

fn best_of(mut f: impl FnMut()) -> Duration {
    f(); // warm the page cache and dentries
    (0..RUNS)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .min()
        .unwrap()
}

#[test]
#[ignore = "a measurement, run by hand in release mode"]
fn grep_ten_thousand_files_vs_ripgrep() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    // 100 directories x 100 files of about 4 KiB of source-like text; one in 50 files holds
    // the needle.
    for d in 0..100 {
        let dir = root.join(format!("pkg{d:03}/src"));
        fs::create_dir_all(&dir).unwrap();
        for i in 0..100 {
            let mut text = String::new();
            for l in 0..80 {
                text.push_str(&format!(
                    "    let value_{l} = compute(item_{i}, {d}); // line {l}\n"
                ));
            }
            if (d * 100 + i) % 50 == 0 {
                text.push_str("    panic!(\"unexpected NEEDLE_TOKEN here\");\n");
            }
            fs::write(dir.join(format!("file{i:03}.rs")), text).unwrap();
        }
    }
    let ws = Workspace::open(root, WorkspaceLimits::default()).unwrap();
    let args: GrepArgs = serde_json::from_value(serde_json::json!({
        "pattern": "NEEDLE_[A-Z]+", "maxResults": 1000
    }))
    .unwrap();
    let mut count = 0;
    let ours = best_of(|| {
        let out = ws.grep(&args).unwrap();
        count = out.match_count;
        assert_eq!(out.files_searched, 10_000);
    });
    assert_eq!(count, 200);
    println!("toolrun-workspace grep: 10,000 files, {count} matches, best of {RUNS}: {ours:?}");
    let Ok(probe) = Command::new("rg").arg("--version").output() else {
        println!("rg is not installed (apt-get install -y ripgrep); no comparison");
        return;
    };
    let version = String::from_utf8_lossy(&probe.stdout);
    let rg = best_of(|| {
        // -uu: no ignore files, hidden files too (as we search); -j2: the same two threads.
        let out = Command::new("rg")
            .args(["-uu", "-j2", "-n", "NEEDLE_[A-Z]+"])
            .arg(root)
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout).lines().count(), 200);
    });
    println!(
        "{}: best of {RUNS}: {rg:?}; ratio ours/rg = {:.2}",
        version.lines().next().unwrap_or("rg"),
        ours.as_secs_f64() / rg.as_secs_f64()
    );
}
