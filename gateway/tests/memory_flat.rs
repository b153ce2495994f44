//! "Gateway memory flat" (SECURITY-CASES.md 11 and 12): the peak resident set of the process
//! running the sandbox, measured *during* a 1 GiB output flood, against a baseline.
//!
//! The peak is VmHWM of /proc/self/status, reset before each measurement by writing 5 to
//! /proc/self/clear_refs. Its own test binary, with a single test, so that nothing else in
//! the process (other tests running in parallel) raises the peak. Needs root, like every
//! sandbox test.

mod sandbox_common;

use sandbox_common::*;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use toolrun::sandbox::Sandbox;
use toolrun::tool::StreamChunk;
use toolrun_runner::{Language, Verdict};

/// A status field of this process, in KiB.
fn status_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/self/status"))
}

/// Resets the peak resident set (VmHWM) to the current one and returns it, in KiB.
fn reset_peak() -> u64 {
    std::fs::write("/proc/self/clear_refs", "5").expect("reset VmHWM (Linux >= 4.0)");
    status_kib("VmHWM:")
}

/// How far the peak rose above `baseline` (from [`reset_peak`]), in MiB.
fn peak_growth_mib(baseline: u64) -> u64 {
    status_kib("VmHWM:").saturating_sub(baseline) / 1024
}

/// The bound on the growth of the peak during a 1 GiB flood.
const FLAT_MIB: u64 = 64;

async fn flood_peak_growth_mib(stream: &str, newline: bool) -> u64 {
    let line = if newline {
        "b'x' * 1023 + b'\\n'"
    } else {
        "b'x' * 1024"
    };
    let code = format!(
        "import sys\nb = ({line}) * 1024\nfor _ in range(1024):\n    sys.{stream}.buffer.write(b)"
    );
    // A receiver that never reads: live output must neither block the run nor pile up.
    let (tx, rx) = mpsc::channel::<StreamChunk>(4);
    let baseline = reset_peak();
    let rec = sandbox()
        .run(
            spec(Language::Python, &code, 10_000),
            Some(tx),
            CancellationToken::new(),
        )
        .await
        .unwrap();
    let grown = peak_growth_mib(baseline);
    drop(rx);
    // The flood really ran: cut at the cap.
    assert_eq!(rec.verdict, Verdict::OutputLimit, "{}", rec.message);
    let cap = toolrun::config::Limits::default().output_limit_bytes as usize;
    let text = if stream == "stdout" {
        &rec.stdout
    } else {
        &rec.stderr
    };
    assert_eq!(text.len(), cap);
    grown
}

#[tokio::test]
async fn peak_memory_stays_flat_during_floods() {
    // Warm up: the sandbox, the runtime and a first run are part of the baseline.
    let rec = py("print('warm')").await;
    assert_eq!(rec.verdict, Verdict::Ok, "{rec:?}");

    // Control: the measurement sees a 128 MiB allocation that is gone again before it is
    // read (a reading of the current RSS after the fact would miss it).
    let baseline = reset_peak();
    let block = vec![1u8; 128 << 20];
    assert_eq!(
        std::hint::black_box(&block)
            .iter()
            .map(|&b| b as u64)
            .sum::<u64>(),
        128 << 20
    );
    drop(block);
    let control = peak_growth_mib(baseline);
    assert!(
        control >= 120,
        "the peak did not see a 128 MiB allocation ({control} MiB): the measurement is blind"
    );

    // Case 11: stdout, without and with newlines; case 12: stderr.
    for (stream, newline) in [("stdout", false), ("stdout", true), ("stderr", false)] {
        let grown = flood_peak_growth_mib(stream, newline).await;
        assert!(
            grown < FLAT_MIB,
            "peak grew by {grown} MiB during a 1 GiB {stream} flood (newlines: {newline})"
        );
    }

    // A runner answering with a 100 MB line: refused without holding the line.
    let (sb, _dir) = broken_runner_sandbox();
    let baseline = reset_peak();
    let err = sb
        .run(
            spec(Language::Bash, "FAKE_HUGE", 5_000),
            None,
            CancellationToken::new(),
        )
        .await
        .unwrap_err();
    let grown = peak_growth_mib(baseline);
    assert!(err.to_string().contains("longer than"), "{err}");
    assert!(grown < 40, "peak grew by {grown} MiB reading a 100 MB line");
}
