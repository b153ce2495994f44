//! Short unified diffs for approvals and edit results.

use std::time::Duration;

use similar::TextDiff;

/// Lines and bytes of a diff shown to a human or a model.
pub(crate) const MAX_DIFF_LINES: usize = 200;
pub(crate) const MAX_DIFF_BYTES: usize = 16 << 10;
/// Myers' diff is O(ND); past this it approximates, so a 16 MiB rewrite stays fast.
const DIFF_TIMEOUT: Duration = Duration::from_millis(250);

/// A unified diff of `old` -> `new` with 3 lines of context, cut at the caps with a note.
pub(crate) fn unified(old: &str, new: &str, path: &str) -> String {
    let diff = TextDiff::configure()
        .timeout(DIFF_TIMEOUT)
        .diff_lines(old, new);
    let mut out = format!("--- a/{path}\n+++ b/{path}\n");
    let mut lines = 2usize;
    let mut total_changes = 0usize;
    let mut cut = false;
    for hunk in diff.unified_diff().context_radius(3).iter_hunks() {
        let text = hunk.to_string();
        for line in text.lines() {
            if line.starts_with('+') || line.starts_with('-') {
                total_changes += 1;
            }
            if cut {
                continue;
            }
            if lines >= MAX_DIFF_LINES || out.len() + line.len() + 1 > MAX_DIFF_BYTES {
                cut = true;
                continue;
            }
            out.push_str(line);
            out.push('\n');
            lines += 1;
        }
    }
    if cut {
        out.push_str(&format!(
            "... (diff cut at {MAX_DIFF_LINES} lines / {} KiB; {total_changes} lines changed in all)\n",
            MAX_DIFF_BYTES >> 10
        ));
    }
    out
}

/// The one-line summary used when either side is not text.
pub(crate) fn binary_summary(path: &str, old: Option<u64>, new: u64) -> String {
    match old {
        Some(old) => format!("binary file {path}: {old} bytes -> {new} bytes (content not shown)"),
        None => format!("new binary file {path}: {new} bytes (content not shown)"),
    }
}
