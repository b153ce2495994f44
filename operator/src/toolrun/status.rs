//! Pure mapping from what a finished pod shows to the ToolRun's status.

use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use toolrun_crd::{Artifact, OmittedArtifact, Phase, ToolRunStatus, Verdict};
use toolrun_runner::RunRecord;

use crate::toolrun::builders::RUN_CONTAINER;
use crate::toolrun::record::RecordError;

/// Largest JSON-encoded size of each of stdout and stderr in the status. The runner caps
/// the streams in bytes, but a control character takes six bytes in JSON; this keeps the
/// ToolRun (spec and status) under etcd's 1.5 MiB request limit.
pub const MAX_STATUS_STREAM_JSON_BYTES: usize = 300 * 1024;

/// Largest JSON size of a whole ToolRun the operator writes: etcd's default request limit
/// is 1.5 MiB (1,572,864 bytes); the rest is room for metadata, conditions and times.
pub const MAX_OBJECT_JSON_BYTES: usize = 1_450_000;

/// The status of a run whose record the runner wrote; `spec_json_bytes` is the size of
/// the ToolRun's spec in JSON (artifacts get what is left of [`MAX_OBJECT_JSON_BYTES`]).
/// The caller adds times, pod name, conditions and observedGeneration.
pub fn finished_status(record: &RunRecord, spec_json_bytes: usize) -> ToolRunStatus {
    let verdict = Verdict::from(record.verdict);
    let (stdout, stdout_cut) = cap_json_size(&record.stdout, MAX_STATUS_STREAM_JSON_BYTES);
    let (stderr, stderr_cut) = cap_json_size(&record.stderr, MAX_STATUS_STREAM_JSON_BYTES);
    let room = MAX_OBJECT_JSON_BYTES
        .saturating_sub(spec_json_bytes)
        .saturating_sub(stdout.len() + stderr.len())
        .saturating_sub(record.message.len() * 6);
    let (artifacts, artifacts_omitted, artifacts_truncated) =
        artifacts_within(record.artifacts.clone(), room);
    ToolRunStatus {
        artifacts,
        artifacts_omitted,
        artifacts_truncated,
        phase: Some(Phase::finished_with(verdict)),
        verdict: Some(verdict),
        reason: (!record.message.is_empty()).then(|| record.message.clone()),
        exit_code: Some(record.exit_code),
        stdout: Some(stdout),
        stderr: Some(stderr),
        stdout_truncated: Some(record.stdout_truncated || stdout_cut),
        stderr_truncated: Some(record.stderr_truncated || stderr_cut),
        duration_ms: Some(record.duration_ms),
        ..ToolRunStatus::default()
    }
}

/// The status of a run whose pod ended without a usable record (`why`).
///
/// - the run container was OOM-killed (with cgroup v2 the kubelet kills the whole
///   container, runner included, so no record is written): MEMORY_LIMIT;
/// - the pod's activeDeadlineSeconds passed after the program started: TIMEOUT;
/// - anything else (image not found, init container failed, deadline passed before the
///   program started, evicted, runner crashed): INFRA_ERROR, the reason saying what the
///   pod showed.
pub fn status_without_record(pod: &Pod, why: &RecordError) -> ToolRunStatus {
    let status = pod.status.as_ref();
    let run = status
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.name == RUN_CONTAINER));
    let terminated = run
        .and_then(|c| c.state.as_ref())
        .and_then(|s| s.terminated.as_ref());
    let started = run.is_some_and(|c| {
        c.state
            .as_ref()
            .is_some_and(|s| s.running.is_some() || s.terminated.is_some())
    });
    let pod_reason = status.and_then(|s| s.reason.as_deref());
    let (verdict, exit_code, reason) =
        if terminated.and_then(|t| t.reason.as_deref()) == Some("OOMKilled") {
            (
                Verdict::MemoryLimit,
                Some(137),
                "the program ran out of memory (container OOMKilled)".to_string(),
            )
        } else if pod_reason == Some("DeadlineExceeded") && started {
            (
                Verdict::Timeout,
                terminated.map(|t| t.exit_code),
                "the pod's active deadline passed before the runner reported".to_string(),
            )
        } else {
            let mut reason = format!("no result from the runner: {why}");
            if let Some(r) = pod_reason {
                let message = status.and_then(|s| s.message.as_deref()).unwrap_or("");
                reason.push_str(&format!("; pod {r}: {message}"));
            }
            let init = status
                .and_then(|s| s.init_container_statuses.as_ref())
                .into_iter()
                .flatten();
            for c in init.chain(run) {
                if let Some(state) = describe_state(c) {
                    reason.push_str(&format!("; container {}: {state}", c.name));
                }
            }
            (Verdict::InfraError, None, reason)
        };
    ToolRunStatus {
        phase: Some(Phase::Failed),
        verdict: Some(verdict),
        reason: Some(reason),
        exit_code,
        ..ToolRunStatus::default()
    }
}

/// A container's state when it is worth reporting (waiting with a reason, or terminated
/// other than successfully).
fn describe_state(c: &ContainerStatus) -> Option<String> {
    let state = c.state.as_ref()?;
    if let Some(w) = &state.waiting {
        let reason = w.reason.as_deref()?;
        return Some(format!(
            "waiting, {reason}: {}",
            w.message.as_deref().unwrap_or("")
        ));
    }
    let t = state.terminated.as_ref()?;
    if t.exit_code == 0 {
        return None;
    }
    Some(format!(
        "exited {}, {}: {}",
        t.exit_code,
        t.reason.as_deref().unwrap_or("unknown"),
        t.message.as_deref().unwrap_or("")
    ))
}

/// `s` cut (at a character boundary) so its JSON string encoding is at most `max`
/// bytes; whether it was cut.
/// The record's artifacts as the status carries them, in at most `room` bytes of JSON:
/// files kept in order while they fit; the first that does not is cut (its base64 at a
/// multiple of 4 characters, so it still decodes to the file's first bytes) and the rest
/// keep their name and size with no content, each flagged `truncated`.
fn artifacts_within(
    a: Option<toolrun_runner::artifacts::Artifacts>,
    room: usize,
) -> (Vec<Artifact>, Vec<OmittedArtifact>, bool) {
    let Some(a) = a else {
        return (Vec::new(), Vec::new(), false);
    };
    let mut truncated = a.truncated;
    let mut omitted: Vec<OmittedArtifact> = a
        .omitted
        .into_iter()
        .take(100)
        .map(|o| OmittedArtifact {
            name: o.name,
            reason: o.reason,
        })
        .collect();
    if !a.error.is_empty() {
        omitted.push(OmittedArtifact {
            name: ".".into(),
            reason: a.error,
        });
    }
    let mut left = room.saturating_sub(
        omitted
            .iter()
            .map(|o| 64 + 6 * (o.name.len() + o.reason.len()))
            .sum(),
    );
    let files = a
        .files
        .into_iter()
        .map(|f| {
            let mut f = Artifact::from(f);
            // Names and media types in JSON (escapes included) and the keys.
            let overhead = 128 + 6 * (f.name.len() + f.media_type.len());
            left = left.saturating_sub(overhead);
            if f.content_base64.len() > left {
                f.content_base64.truncate(left / 4 * 4);
                f.truncated = true;
                truncated = true;
            }
            left -= f.content_base64.len();
            f
        })
        .collect();
    (files, omitted, truncated)
}

fn cap_json_size(s: &str, max: usize) -> (String, bool) {
    let mut size = 2; // the quotes
    for (i, c) in s.char_indices() {
        size += match c {
            '"' | '\\' | '\n' | '\r' | '\t' | '\u{8}' | '\u{c}' => 2,
            c if (c as u32) < 0x20 => 6,
            c => c.len_utf8(),
        };
        if size > max {
            return (s[..i].to_string(), true);
        }
    }
    (s.to_string(), false)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{
        ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStateWaiting,
        PodStatus,
    };
    use toolrun_runner::PROTOCOL_VERSION;

    use super::*;

    fn record(verdict: toolrun_runner::Verdict, exit_code: i32) -> RunRecord {
        RunRecord {
            version: PROTOCOL_VERSION,
            verdict,
            exit_code,
            signal: None,
            stdout: "out\n".into(),
            stderr: "err\n".into(),
            stdout_truncated: false,
            stderr_truncated: true,
            timed_out: false,
            duration_ms: 42,
            message: String::new(),
            artifacts: None,
        }
    }

    #[test]
    fn a_record_becomes_the_status() {
        let ok = finished_status(&record(toolrun_runner::Verdict::Ok, 0), 1_000);
        assert_eq!(ok.phase, Some(Phase::Succeeded));
        assert_eq!(ok.verdict, Some(Verdict::Ok));
        assert_eq!(ok.reason, None);
        assert_eq!(ok.exit_code, Some(0));
        assert_eq!(ok.stdout.as_deref(), Some("out\n"));
        assert_eq!(ok.stderr.as_deref(), Some("err\n"));
        assert_eq!(ok.stdout_truncated, Some(false));
        assert_eq!(ok.stderr_truncated, Some(true));
        assert_eq!(ok.duration_ms, Some(42));
        let mut failed = record(toolrun_runner::Verdict::Timeout, 137);
        failed.message = "wall-clock timeout".into();
        let failed = finished_status(&failed, 1_000);
        assert_eq!(failed.phase, Some(Phase::Failed));
        assert_eq!(failed.verdict, Some(Verdict::Timeout));
        assert_eq!(failed.reason.as_deref(), Some("wall-clock timeout"));
    }

    #[test]
    fn artifacts_fit_what_is_left_of_the_object() {
        use base64::Engine as _;
        use toolrun_runner::artifacts::{Artifact as RunnerArtifact, Artifacts, Omitted};
        let b64 = |n: usize| base64::engine::general_purpose::STANDARD.encode(vec![7u8; n]);
        let file = |name: &str, n: usize| RunnerArtifact {
            name: name.into(),
            size: n as u64,
            media_type: "image/png".into(),
            content_base64: b64(n),
            truncated: false,
        };
        let mut r = record(toolrun_runner::Verdict::Ok, 0);
        r.artifacts = Some(Artifacts {
            files: vec![
                file("a.png", 300_000),
                file("b.png", 300_000),
                file("c.png", 10),
            ],
            omitted: vec![Omitted {
                name: "link".into(),
                reason: "a symlink (not followed)".into(),
            }],
            truncated: false,
            error: String::new(),
        });
        // A small spec: everything fits, unchanged.
        let s = finished_status(&r, 1_000);
        assert_eq!(s.artifacts.len(), 3);
        assert_eq!(s.artifacts[0].content_base64, b64(300_000));
        assert!(!s.artifacts_truncated);
        assert_eq!(s.artifacts_omitted[0].name, "link");
        // A large spec: the second file is cut at a base64 boundary and the third emptied,
        // and the whole object stays under etcd's limit.
        let s = finished_status(&r, 800_000);
        assert!(s.artifacts_truncated);
        assert_eq!(s.artifacts[0].content_base64, b64(300_000));
        assert!(!s.artifacts[0].truncated);
        let cut = &s.artifacts[1];
        assert!(cut.truncated && cut.size == 300_000);
        assert_eq!(cut.content_base64.len() % 4, 0);
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(&cut.content_base64)
            .unwrap();
        assert!(!bytes.is_empty() && bytes.len() < 300_000);
        assert!(bytes.iter().all(|b| *b == 7));
        assert!(s.artifacts[2].truncated && s.artifacts[2].content_base64.is_empty());
        let status_json = serde_json::to_vec(&s).unwrap().len();
        assert!(
            800_000 + status_json <= MAX_OBJECT_JSON_BYTES,
            "{status_json}"
        );
    }

    #[test]
    fn streams_are_capped_by_their_json_size() {
        let mut r = record(toolrun_runner::Verdict::Ok, 0);
        r.stdout = "\u{1}".repeat(200_000); // 1.2 MB of JSON
        r.stderr = "é".repeat(100_000); // 200 kB: fits
        let s = finished_status(&r, 1_000);
        let out = s.stdout.unwrap();
        assert!(serde_json::to_string(&out).unwrap().len() <= MAX_STATUS_STREAM_JSON_BYTES);
        assert!(out.len() > 40_000);
        assert_eq!(s.stdout_truncated, Some(true));
        assert_eq!(s.stderr.unwrap().chars().count(), 100_000);
        for text in ["a\"b\\c\nd\te", "ü€😀", "\u{0}\u{1f}x"] {
            let (cut, was_cut) = cap_json_size(text, usize::MAX);
            assert!(!was_cut);
            assert_eq!(cut, text);
            let exact = serde_json::to_string(text).unwrap().len();
            assert_eq!(cap_json_size(text, exact), (text.to_string(), false));
            let (cut, was_cut) = cap_json_size(text, exact - 1);
            assert!(was_cut && text.starts_with(&cut) && cut.len() < text.len());
        }
    }

    fn pod_with(reason: Option<&str>, run_state: Option<ContainerState>) -> Pod {
        Pod {
            status: Some(PodStatus {
                phase: Some("Failed".into()),
                reason: reason.map(Into::into),
                message: reason.map(|_| "details".into()),
                container_statuses: run_state.map(|state| {
                    vec![ContainerStatus {
                        name: RUN_CONTAINER.into(),
                        state: Some(state),
                        ..ContainerStatus::default()
                    }]
                }),
                ..PodStatus::default()
            }),
            ..Pod::default()
        }
    }

    fn terminated(exit_code: i32, reason: &str) -> ContainerState {
        ContainerState {
            terminated: Some(ContainerStateTerminated {
                exit_code,
                reason: Some(reason.into()),
                ..ContainerStateTerminated::default()
            }),
            ..ContainerState::default()
        }
    }

    #[test]
    fn a_pod_without_record_explains_itself() {
        let oom = status_without_record(
            &pod_with(None, Some(terminated(137, "OOMKilled"))),
            &RecordError::Empty,
        );
        assert_eq!(oom.verdict, Some(Verdict::MemoryLimit));
        assert_eq!(oom.phase, Some(Phase::Failed));
        assert_eq!(oom.exit_code, Some(137));

        let running = ContainerState {
            running: Some(ContainerStateRunning::default()),
            ..ContainerState::default()
        };
        let deadline = status_without_record(
            &pod_with(Some("DeadlineExceeded"), Some(running)),
            &RecordError::Empty,
        );
        assert_eq!(deadline.verdict, Some(Verdict::Timeout));

        // The deadline passed while the image was still being pulled: not the program's
        // fault.
        let pulling = ContainerState {
            waiting: Some(ContainerStateWaiting {
                reason: Some("ImagePullBackOff".into()),
                message: Some("pull access denied".into()),
            }),
            ..ContainerState::default()
        };
        let infra = status_without_record(
            &pod_with(Some("DeadlineExceeded"), Some(pulling)),
            &RecordError::Empty,
        );
        assert_eq!(infra.verdict, Some(Verdict::InfraError));
        let reason = infra.reason.unwrap();
        assert!(reason.contains("ImagePullBackOff"), "{reason}");
        assert!(reason.contains("pull access denied"), "{reason}");
        assert!(reason.contains("DeadlineExceeded"), "{reason}");

        let crashed = status_without_record(
            &pod_with(None, Some(terminated(1, "Error"))),
            &RecordError::NoResult("exec format error".into()),
        );
        assert_eq!(crashed.verdict, Some(Verdict::InfraError));
        let reason = crashed.reason.unwrap();
        assert!(reason.contains("exited 1, Error"), "{reason}");
        assert!(reason.contains("exec format error"), "{reason}");

        let evicted = status_without_record(&pod_with(Some("Evicted"), None), &RecordError::Empty);
        assert_eq!(evicted.verdict, Some(Verdict::InfraError));
        assert!(evicted.reason.unwrap().contains("Evicted"));
    }
}
