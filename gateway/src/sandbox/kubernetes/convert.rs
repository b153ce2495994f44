//! Pure mapping between a gateway run and a ToolRun: the spec the gateway creates, and the
//! record it reads back from the status.

use std::collections::BTreeMap;

use kube::api::ObjectMeta;
use toolrun_crd::{
    EnvVar, Limits, MAX_CODE_CHARS, MAX_OUTPUT_BYTES, MAX_STDIN_CHARS, Phase, ToolRun, ToolRunSpec,
    ToolRunStatus, labels,
};
use toolrun_runner::artifacts::{Artifacts, Omitted};
use toolrun_runner::{PROTOCOL_VERSION, RunRecord, Verdict};

use crate::config::KubernetesConfig;
use crate::sandbox::SandboxRun;

/// Label on every ToolRun the gateway creates; the shared watch selects on it.
pub const CREATED_BY: &str = "app.kubernetes.io/created-by";
/// Value of [`CREATED_BY`].
pub const CREATED_BY_VALUE: &str = "toolrun-gateway";
/// Longest `spec.callId` the CRD accepts; longer ids are cut.
pub const MAX_CALL_ID_CHARS: usize = 256;
/// Most `spec.args` entries the CRD accepts.
pub const MAX_ARGS: usize = 64;
/// Most `spec.env` entries the CRD accepts.
pub const MAX_ENV: usize = 64;
/// Longest arg or env value the CRD accepts, in characters.
pub const MAX_VALUE_CHARS: usize = 1024;
/// Most `spec.command` elements of an image run the CRD accepts.
pub const MAX_COMMAND: usize = 64;
/// Longest `spec.command` element the CRD accepts, in characters.
pub const MAX_COMMAND_CHARS: usize = 4096;

/// The environment the gateway gives every run (see run_code); the operator adds the same
/// base environment itself, so these are not repeated in the spec (the CRD allows only
/// [`MAX_ENV`] entries, which are the caller's).
const GATEWAY_BASE_ENV: [(&str, &str); 4] = [
    ("PATH", "/usr/local/bin:/usr/bin:/bin"),
    ("HOME", "/tmp"),
    ("LANG", "C.UTF-8"),
    ("PYTHONDONTWRITEBYTECODE", "1"),
];

/// A run the ToolRun resource cannot express (the CRD's bounds are tighter than run_code's
/// own for some fields, because a ToolRun must fit in one etcd object).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the kubernetes backend cannot run this call: {0}")]
pub struct Unrepresentable(pub String);

/// The ToolRun for `run`, named `name`, in `cfg.namespace`.
pub fn tool_run(
    name: &str,
    run: &SandboxRun,
    cfg: &KubernetesConfig,
) -> Result<ToolRun, Unrepresentable> {
    let spec = &run.spec;
    // An image run: the command is the runner's interpreter and args (Language::Exec), in
    // the ToolRun's own `command` field and bounds.
    let command = match &run.image {
        Some(_) => image_command(run)?,
        None => Vec::new(),
    };
    let code_chars = spec.code.chars().count();
    if code_chars > MAX_CODE_CHARS as usize {
        return Err(Unrepresentable(format!(
            "code has {code_chars} characters, at most {MAX_CODE_CHARS}"
        )));
    }
    let stdin_chars = spec.stdin.chars().count();
    if stdin_chars > MAX_STDIN_CHARS as usize {
        return Err(Unrepresentable(format!(
            "stdin has {stdin_chars} characters, at most {MAX_STDIN_CHARS}"
        )));
    }
    let args = if run.image.is_some() {
        Vec::new()
    } else {
        spec.args.clone()
    };
    if args.len() > MAX_ARGS {
        return Err(Unrepresentable(format!(
            "{} arguments, at most {MAX_ARGS}",
            args.len()
        )));
    }
    if let Some((i, a)) = args
        .iter()
        .enumerate()
        .find(|(_, a)| a.chars().count() > MAX_VALUE_CHARS)
    {
        return Err(Unrepresentable(format!(
            "argument {i} has {} characters, at most {MAX_VALUE_CHARS}",
            a.chars().count()
        )));
    }
    let env: Vec<EnvVar> = spec
        .env
        .iter()
        .filter(|(k, v)| !GATEWAY_BASE_ENV.contains(&(k.as_str(), v.as_str())))
        .map(|(k, v)| EnvVar {
            name: k.clone(),
            value: v.clone(),
        })
        .collect();
    if env.len() > MAX_ENV {
        return Err(Unrepresentable(format!(
            "{} environment variables, at most {MAX_ENV}",
            env.len()
        )));
    }
    if let Some(e) = env
        .iter()
        .find(|e| e.value.chars().count() > MAX_VALUE_CHARS)
    {
        return Err(Unrepresentable(format!(
            "environment variable {} has a value of {} characters, at most {MAX_VALUE_CHARS}",
            e.name,
            e.value.chars().count()
        )));
    }
    // The CRD requires non-empty code; a lone newline is an empty program in all three
    // languages (exit 0, no output), as an empty string is on the local backend. An image
    // run has none.
    let mut code = if run.image.is_some() {
        String::new()
    } else if spec.code.is_empty() {
        "\n".to_string()
    } else {
        spec.code.clone()
    };
    // A run in a session starts in the workspace (the operator's working directory for
    // session runs); a shell asked for a directory below it changes there first.
    if run.session.is_some()
        && run.language == "bash"
        && spec.workdir != crate::session::WORKSPACE_IN_SANDBOX
        && spec
            .workdir
            .starts_with(&format!("{}/", crate::session::WORKSPACE_IN_SANDBOX))
    {
        let quoted = spec.workdir.replace('\'', "'\\''");
        code = format!("cd '{quoted}' || exit 1\n{code}");
    }
    let call_id = match run.call_id.char_indices().nth(MAX_CALL_ID_CHARS) {
        Some((cut, _)) => run.call_id[..cut].to_string(),
        None if run.call_id.is_empty() => name.to_string(),
        None => run.call_id.clone(),
    };
    let tool = if run.tool.is_empty() {
        "run_code".to_string()
    } else {
        run.tool.clone()
    };
    let limits = Limits {
        timeout_seconds: Some(timeout_seconds(spec.limits.timeout_ms)),
        memory_mib: Some(clamp_u32(run.limits.memory_mb)),
        cpu_millis: None,
        processes: Some(clamp_u32(run.limits.max_processes)),
        output_bytes: Some(clamp_u32(run.limits.output_limit_bytes).min(MAX_OUTPUT_BYTES)),
    };
    Ok(ToolRun {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(cfg.namespace.clone()),
            labels: Some(
                BTreeMap::from([
                    (CREATED_BY.to_string(), CREATED_BY_VALUE.to_string()),
                    (labels::CALL_ID.to_string(), labels::label_value(&call_id)),
                    (labels::TENANT.to_string(), labels::label_value(&run.tenant)),
                ])
                .into_iter()
                .chain(
                    run.session
                        .iter()
                        .map(|s| (labels::SESSION.to_string(), s.clone())),
                )
                .collect(),
            ),
            ..ObjectMeta::default()
        },
        spec: ToolRunSpec {
            tool,
            call_id,
            language: if run.image.is_some() {
                String::new()
            } else {
                run.language.clone()
            },
            code,
            image: run.image.clone(),
            command,
            args,
            env,
            stdin: spec.stdin.clone(),
            limits,
            ttl_seconds_after_finished: cfg.ttl_seconds_after_finished,
            runtime_class_name: cfg.runtime_class_name.clone(),
            session: run.session.clone(),
            cancel: false,
        },
        status: None,
    })
}

/// The ToolRun's `command` of an image run: the program (the runner spec's interpreter)
/// and its arguments, within the CRD's bounds; an image run never joins a session.
fn image_command(run: &SandboxRun) -> Result<Vec<String>, Unrepresentable> {
    if run.session.is_some() {
        return Err(Unrepresentable(
            "an image run cannot run in a session's pod".into(),
        ));
    }
    if run.spec.language != toolrun_runner::Language::Exec || run.spec.interpreter.is_empty() {
        return Err(Unrepresentable(
            "an image run executes its command (language exec, a program)".into(),
        ));
    }
    let command: Vec<String> = std::iter::once(run.spec.interpreter.clone())
        .chain(run.spec.args.iter().cloned())
        .collect();
    if command.len() > MAX_COMMAND {
        return Err(Unrepresentable(format!(
            "the command has {} elements, at most {MAX_COMMAND}",
            command.len()
        )));
    }
    if let Some((i, c)) = command
        .iter()
        .enumerate()
        .find(|(_, c)| c.is_empty() || c.chars().count() > MAX_COMMAND_CHARS)
    {
        return Err(Unrepresentable(format!(
            "command element {i} has {} characters, 1..={MAX_COMMAND_CHARS}",
            c.chars().count()
        )));
    }
    Ok(command)
}

/// Whole seconds covering `timeout_ms` (at least 1, at most the CRD's maximum).
pub fn timeout_seconds(timeout_ms: u64) -> u32 {
    let s = timeout_ms.div_ceil(1000).max(1);
    clamp_u32(s).min(toolrun_crd::MAX_TIMEOUT_SECONDS)
}

fn clamp_u32(v: u64) -> u32 {
    u32::try_from(v).unwrap_or(u32::MAX)
}

/// The runner record a finished status describes; `None` while the run is not finished.
pub fn record_from_status(status: &ToolRunStatus) -> Option<RunRecord> {
    let phase = status.phase?;
    if !phase.is_finished() {
        return None;
    }
    let verdict = match status.verdict {
        Some(v) => Verdict::from(v),
        // A finished phase without a verdict is not something the operator writes; read it
        // as its phase says rather than wait forever.
        None if phase == Phase::Succeeded => Verdict::Ok,
        None => Verdict::InfraError,
    };
    let exit_code = status.exit_code.unwrap_or(match verdict {
        Verdict::Ok => 0,
        _ => -1,
    });
    Some(RunRecord {
        version: PROTOCOL_VERSION,
        verdict,
        exit_code,
        signal: None,
        stdout: status.stdout.clone().unwrap_or_default(),
        stderr: status.stderr.clone().unwrap_or_default(),
        stdout_truncated: status.stdout_truncated.unwrap_or(false),
        stderr_truncated: status.stderr_truncated.unwrap_or(false),
        timed_out: verdict == Verdict::Timeout,
        duration_ms: status.duration_ms.unwrap_or(0),
        message: status.reason.clone().unwrap_or_default(),
        artifacts: (!status.artifacts.is_empty() || !status.artifacts_omitted.is_empty()).then(
            || Artifacts {
                files: status.artifacts.iter().cloned().map(Into::into).collect(),
                omitted: status
                    .artifacts_omitted
                    .iter()
                    .map(|o| Omitted {
                        name: o.name.clone(),
                        reason: o.reason.clone(),
                    })
                    .collect(),
                truncated: status.artifacts_truncated,
                error: String::new(),
            },
        ),
    })
}

/// The pod is (or was) running the program: the status shows Running or a start time.
pub fn has_started(status: Option<&ToolRunStatus>) -> bool {
    status.is_some_and(|s| s.phase == Some(Phase::Running) || s.start_time.is_some())
}

/// A record the gateway writes itself (cancel, start timeout, ToolRun gone).
pub fn synthetic_record(
    verdict: Verdict,
    duration_ms: u64,
    stdout: String,
    stderr: String,
    message: String,
) -> RunRecord {
    RunRecord {
        version: PROTOCOL_VERSION,
        verdict,
        // As the local backend reports a run it killed from outside.
        exit_code: if verdict == Verdict::InfraError {
            -1
        } else {
            137
        },
        signal: (verdict != Verdict::InfraError).then_some(9),
        stdout,
        stderr,
        stdout_truncated: false,
        stderr_truncated: false,
        timed_out: verdict == Verdict::Timeout,
        duration_ms,
        message,
        artifacts: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Limits as GatewayLimits;
    use toolrun_runner::{Language, RunSpec, RunnerLimits};

    fn run(code: &str) -> SandboxRun {
        let limits = GatewayLimits::default();
        let mut env: BTreeMap<String, String> = GATEWAY_BASE_ENV
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        env.insert("MY_VAR".into(), "x".into());
        SandboxRun {
            language: "bash".into(),
            spec: RunSpec {
                language: Language::Bash,
                code: code.into(),
                args: vec!["a".into(), "b c".into()],
                env,
                stdin: "in".into(),
                interpreter: "/bin/bash".into(),
                workdir: "/tmp".into(),
                limits: RunnerLimits {
                    timeout_ms: 1_500,
                    output_limit_bytes: limits.output_limit_bytes,
                    cpu_seconds: 30,
                    max_processes: 64,
                    max_file_bytes: 0,
                    max_open_files: 0,
                    address_space_bytes: 0,
                },
                setup: Default::default(),
            },
            limits,
            tool: "code_executor".into(),
            call_id: "call 1".into(),
            tenant: "team-a".into(),
            workspace: None,
            session: None,
            image: None,
        }
    }

    #[test]
    fn a_session_run_names_its_toolsession_and_starts_in_its_directory() {
        let cfg = KubernetesConfig::default();
        // One-shot: no session, no label, the code as given.
        let tr = tool_run("run-1", &run("pwd"), &cfg).unwrap();
        assert_eq!(tr.spec.session, None);
        assert!(!tr.metadata.labels.unwrap().contains_key(labels::SESSION));
        assert_eq!(tr.spec.code, "pwd");
        // In a session at /workspace: named in spec and label, the code unchanged.
        let mut r = run("pwd");
        r.session = Some("ts-s-1-abc".into());
        r.spec.workdir = "/workspace".into();
        let tr = tool_run("run-2", &r, &cfg).unwrap();
        assert_eq!(tr.spec.session.as_deref(), Some("ts-s-1-abc"));
        assert_eq!(tr.metadata.labels.unwrap()[labels::SESSION], "ts-s-1-abc");
        assert_eq!(tr.spec.code, "pwd");
        // A shell's cwd below it: the program changes there first (quoted).
        r.spec.workdir = "/workspace/it's here".into();
        let tr = tool_run("run-3", &r, &cfg).unwrap();
        assert_eq!(tr.spec.code, "cd '/workspace/it'\\''s here' || exit 1\npwd");
        let out = std::process::Command::new("bash")
            .arg("-c")
            .arg(format!(
                "mkdir -p \"$T/workspace/it's here\" && cd \"$T\" && {}",
                tr.spec.code.replace("/workspace", "./workspace")
            ))
            .env(
                "T",
                std::env::temp_dir().join(format!("conv-{}", std::process::id())),
            )
            .output()
            .unwrap();
        assert!(
            String::from_utf8_lossy(&out.stdout)
                .trim_end()
                .ends_with("/workspace/it's here"),
            "{out:?}"
        );
    }

    /// A custom tool's image run, as the sandbox pool makes it.
    fn image_run() -> SandboxRun {
        let mut r = run("");
        r.language = String::new();
        r.image = Some("registry.example.com/tools/wc:1".into());
        r.spec.language = Language::Exec;
        r.spec.interpreter = "python3".into();
        r.spec.args = vec!["-c".into(), "x".repeat(2_000)];
        r.spec.stdin = r#"{"text":"a b"}"#.into();
        r.tool = "word_count".into();
        r
    }

    #[test]
    fn an_image_run_becomes_image_and_command_with_the_arguments_on_stdin() {
        let cfg = KubernetesConfig::default();
        let tr = tool_run("run-img", &image_run(), &cfg).unwrap();
        let s = &tr.spec;
        assert_eq!(s.image.as_deref(), Some("registry.example.com/tools/wc:1"));
        assert_eq!(
            s.command,
            ["python3".to_string(), "-c".into(), "x".repeat(2_000)]
        );
        assert_eq!((s.language.as_str(), s.code.as_str()), ("", ""));
        assert!(s.args.is_empty());
        assert_eq!(s.stdin, r#"{"text":"a b"}"#);
        assert_eq!(s.tool, "word_count");
        assert_eq!(s.session, None);
        // Control: the same run without an image is a language run.
        let mut plain = run("echo hi");
        plain.spec.args = vec!["a".into()];
        let tr = tool_run("run-plain", &plain, &cfg).unwrap();
        assert_eq!((tr.spec.image, tr.spec.command.len()), (None, 0));
        assert_eq!(tr.spec.language, "bash");
        // What the ToolRun cannot hold, or an image run in a session, is refused.
        let mut long = image_run();
        long.spec.args = vec!["y".repeat(MAX_COMMAND_CHARS + 1)];
        let e = tool_run("r", &long, &cfg).unwrap_err();
        assert!(e.0.contains("command element 1"), "{e}");
        let mut many = image_run();
        many.spec.args = vec!["a".into(); MAX_COMMAND];
        let e = tool_run("r", &many, &cfg).unwrap_err();
        assert!(e.0.contains("at most 64"), "{e}");
        let mut in_session = image_run();
        in_session.session = Some("ts-1".into());
        let e = tool_run("r", &in_session, &cfg).unwrap_err();
        assert!(e.0.contains("session"), "{e}");
        let mut not_exec = image_run();
        not_exec.spec.language = Language::Python;
        assert!(tool_run("r", &not_exec, &cfg).is_err());
    }

    #[test]
    fn the_spec_carries_the_call() {
        let cfg = KubernetesConfig {
            runtime_class_name: Some("gvisor".into()),
            ..KubernetesConfig::default()
        };
        let tr = tool_run("run-abc", &run("echo hi"), &cfg).unwrap();
        assert_eq!(tr.metadata.name.as_deref(), Some("run-abc"));
        assert_eq!(tr.metadata.namespace.as_deref(), Some("toolrun-sandbox"));
        let labels = tr.metadata.labels.unwrap();
        assert_eq!(labels[CREATED_BY], CREATED_BY_VALUE);
        assert_eq!(labels[labels::CALL_ID], labels::label_value("call 1"));
        assert_eq!(labels[labels::TENANT], "team-a");
        let s = tr.spec;
        assert_eq!(s.tool, "code_executor");
        assert_eq!(s.call_id, "call 1");
        assert_eq!(s.language, "bash");
        assert_eq!(s.code, "echo hi");
        assert_eq!(s.args, ["a", "b c"]);
        assert_eq!(s.stdin, "in");
        // Only the caller's variable: the base environment is the operator's.
        assert_eq!(
            s.env,
            [EnvVar {
                name: "MY_VAR".into(),
                value: "x".into()
            }]
        );
        assert_eq!(s.limits.timeout_seconds, Some(2));
        assert_eq!(s.limits.memory_mib, Some(256));
        assert_eq!(s.limits.processes, Some(64));
        // 1 MiB asked, the CRD's maximum kept.
        assert_eq!(s.limits.output_bytes, Some(MAX_OUTPUT_BYTES));
        assert_eq!(s.ttl_seconds_after_finished, Some(300));
        assert_eq!(s.runtime_class_name.as_deref(), Some("gvisor"));
        assert!(!s.cancel);
    }

    #[test]
    fn what_the_crd_cannot_hold_is_refused_by_name() {
        let cfg = KubernetesConfig::default();
        let mut r = run(&"x".repeat(MAX_CODE_CHARS as usize + 1));
        assert!(
            tool_run("n", &r, &cfg)
                .unwrap_err()
                .to_string()
                .contains("code has 50001 characters")
        );
        r.spec.code = "x".into();
        r.spec.stdin = "y".repeat(MAX_STDIN_CHARS as usize + 1);
        assert!(tool_run("n", &r, &cfg).unwrap_err().0.contains("stdin"));
        r.spec.stdin.clear();
        r.spec.args = vec!["a".into(); MAX_ARGS + 1];
        assert!(
            tool_run("n", &r, &cfg)
                .unwrap_err()
                .0
                .contains("65 arguments")
        );
        r.spec.args = vec!["é".repeat(MAX_VALUE_CHARS + 1)];
        assert!(
            tool_run("n", &r, &cfg)
                .unwrap_err()
                .0
                .contains("argument 0")
        );
        r.spec.args = vec!["é".repeat(MAX_VALUE_CHARS)];
        assert!(tool_run("n", &r, &cfg).is_ok());
        r.spec.env = (0..=MAX_ENV)
            .map(|i| (format!("V{i}"), "v".into()))
            .collect();
        assert!(
            tool_run("n", &r, &cfg)
                .unwrap_err()
                .0
                .contains("65 environment variables")
        );
        r.spec.env = BTreeMap::from([("BIG".into(), "v".repeat(MAX_VALUE_CHARS + 1))]);
        assert!(tool_run("n", &r, &cfg).unwrap_err().0.contains("BIG"));
    }

    #[test]
    fn edge_values_are_made_valid() {
        let cfg = KubernetesConfig::default();
        let mut r = run("");
        r.call_id = String::new();
        r.tool = String::new();
        r.spec.limits.timeout_ms = 1;
        let tr = tool_run("run-x", &r, &cfg).unwrap();
        assert_eq!(tr.spec.code, "\n");
        assert_eq!(tr.spec.call_id, "run-x");
        assert_eq!(tr.spec.tool, "run_code");
        assert_eq!(tr.spec.limits.timeout_seconds, Some(1));
        r.call_id = "ü".repeat(300);
        let tr = tool_run("run-x", &r, &cfg).unwrap();
        assert_eq!(tr.spec.call_id.chars().count(), MAX_CALL_ID_CHARS);
        assert_eq!(timeout_seconds(30_000), 30);
        assert_eq!(timeout_seconds(30_001), 31);
        assert_eq!(timeout_seconds(u64::MAX), toolrun_crd::MAX_TIMEOUT_SECONDS);
    }

    #[test]
    fn a_finished_status_becomes_the_record() {
        let mut st = ToolRunStatus {
            phase: Some(Phase::Running),
            ..ToolRunStatus::default()
        };
        assert_eq!(record_from_status(&st), None);
        assert!(has_started(Some(&st)));
        assert!(!has_started(None));
        st.phase = Some(Phase::Failed);
        st.verdict = Some(toolrun_crd::Verdict::Timeout);
        st.exit_code = Some(137);
        st.stdout = Some("partial".into());
        st.stderr = Some("err".into());
        st.stdout_truncated = Some(true);
        st.duration_ms = Some(2_001);
        st.reason = Some("wall-clock timeout".into());
        let r = record_from_status(&st).unwrap();
        assert_eq!(r.verdict, Verdict::Timeout);
        assert!(r.timed_out);
        assert_eq!(r.exit_code, 137);
        assert_eq!(r.stdout, "partial");
        assert_eq!(r.stderr, "err");
        assert!(r.stdout_truncated && !r.stderr_truncated);
        assert_eq!(r.duration_ms, 2_001);
        assert_eq!(r.message, "wall-clock timeout");
        let infra = record_from_status(&ToolRunStatus {
            phase: Some(Phase::Failed),
            verdict: Some(toolrun_crd::Verdict::InfraError),
            reason: Some("image not found".into()),
            ..ToolRunStatus::default()
        })
        .unwrap();
        assert_eq!(infra.verdict, Verdict::InfraError);
        assert_eq!(infra.exit_code, -1);
        assert_eq!(infra.message, "image not found");
        assert_eq!(infra.artifacts, None);
        // Artifacts in the status come back as the runner collected them.
        st.artifacts = vec![toolrun_crd::Artifact {
            name: "figure-1.png".into(),
            size: 3,
            media_type: "image/png".into(),
            content_base64: "AAAA".into(),
            truncated: false,
        }];
        st.artifacts_omitted = vec![toolrun_crd::OmittedArtifact {
            name: "link".into(),
            reason: "a symlink (not followed)".into(),
        }];
        st.artifacts_truncated = true;
        let a = record_from_status(&st).unwrap().artifacts.unwrap();
        assert_eq!(a.files[0].name, "figure-1.png");
        assert_eq!(a.files[0].content_base64, "AAAA");
        assert_eq!(a.omitted[0].reason, "a symlink (not followed)");
        assert!(a.truncated);
    }
}
