//! `run_code` (and the seed's `code_executor` shape): untrusted code in a sandbox.
//!
//! The code-interpreter parts: a run's language is a built-in (python, javascript, bash) or
//! one of `sandbox.languages` (its source written to `/tmp/.toolrun/main.EXT` by the runner,
//! its command run by bash: a compiled language compiles and runs within the one timeout and
//! limits); python gets matplotlib's Agg backend with `show()` saving figures as artifacts
//! ([`MPL_BACKEND`]); and the files a program writes to its outputs directory come back as
//! `artifacts`, collected by the runner inside the sandbox and only checked, decoded and
//! bounded here ([`artifacts_out`]).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tokio::sync::Semaphore;
use tokio::time::Instant;
use toolrun_runner::artifacts::ArtifactSpec;
use toolrun_runner::interp;
use toolrun_runner::{Language, RunRecord, RunSetup, RunSpec, SetupFile, Verdict};

use crate::approval::{ApprovalAsk, ApprovalKind};
use crate::config::{Limits, SandboxConfig};
use crate::error::{ErrorCode, ToolError};
use crate::metrics::{Metrics, VerdictLabels};
use crate::sandbox::{Sandbox, SandboxError, SandboxRun};
use crate::tool::{
    ApprovalPolicy, CallContext, Category, Determinism, SideEffect, ToolMetadata, TypedTool,
};

/// run_code's default `timeout_ms` (its ceiling for the `timeout` argument), from the seed's
/// code_executor configuration.
pub const RUN_CODE_TIMEOUT_MS: u64 = 30_000;

/// Shared by every sandboxed tool: the backend, a bound on concurrent runs, and metrics.
pub struct SandboxPool {
    sandbox: Arc<dyn Sandbox>,
    slots: Semaphore,
    config: SandboxConfig,
    metrics: Arc<Metrics>,
    /// matplotlib's font list cache, built once by [`SandboxPool::probe_languages`].
    mpl_font_cache: std::sync::OnceLock<SetupFile>,
}

impl SandboxPool {
    /// A pool over `sandbox` allowing `config.max_concurrent_runs` (default: cores) at once.
    pub fn new(sandbox: Arc<dyn Sandbox>, config: SandboxConfig, metrics: Arc<Metrics>) -> Self {
        let slots = config
            .max_concurrent_runs
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()));
        SandboxPool {
            sandbox,
            slots: Semaphore::new(slots),
            config,
            metrics,
            mpl_font_cache: std::sync::OnceLock::new(),
        }
    }

    /// The backend.
    pub fn sandbox(&self) -> &Arc<dyn Sandbox> {
        &self.sandbox
    }

    /// Runs `code`, waiting for a free slot until the call's deadline.
    pub async fn run(
        &self,
        code: CodeRun,
        limits: &Limits,
        ctx: &CallContext,
    ) -> Result<RunCodeOutput, ToolError> {
        let queued_at = Instant::now();
        self.metrics.sandbox_queued.inc();
        let permit = tokio::select! {
            p = tokio::time::timeout_at(ctx.deadline, self.slots.acquire()) => p,
            _ = ctx.cancel.cancelled() => {
                self.metrics.sandbox_queued.dec();
                return Err(ToolError::new(ErrorCode::Cancelled, "cancelled while queued"));
            }
        };
        self.metrics.sandbox_queued.dec();
        let _permit = match permit {
            Ok(Ok(p)) => p,
            Ok(Err(_)) => {
                return Err(ToolError::new(
                    ErrorCode::Unavailable,
                    "the sandbox pool is closed",
                ));
            }
            Err(_) => {
                return Err(ToolError::new(
                    ErrorCode::Timeout,
                    format!(
                        "timed out after {} ms waiting for a free sandbox (all {} busy)",
                        queued_at.elapsed().as_millis(),
                        self.config.max_concurrent_runs.unwrap_or(0).max(1)
                    ),
                ));
            }
        };
        // The program gets what is left of the call's budget, at most what it asked for.
        let remaining = ctx.deadline.saturating_duration_since(Instant::now());
        let timeout = code.timeout.min(remaining);
        if timeout < Duration::from_millis(1) {
            return Err(ToolError::new(
                ErrorCode::Timeout,
                "no time left to start the run",
            ));
        }
        let kubernetes = self.sandbox.info().backend == "kubernetes";
        let image = code.image;
        let mut args = code.args;
        let mut resolved = match &image {
            // The runner executes the command itself; the operator puts it in the image.
            Some(i) => {
                if !kubernetes {
                    return Err(ToolError::new(
                        ErrorCode::Unavailable,
                        format!(
                            "container image {:?}: images run on the kubernetes backend only",
                            i.image
                        ),
                    ));
                }
                let Some((program, rest)) = i.command.split_first() else {
                    return Err(ToolError::new(
                        ErrorCode::ExecutionError,
                        "the image's command is empty",
                    ));
                };
                args.splice(0..0, rest.iter().cloned());
                Resolved {
                    language: Language::Exec,
                    interpreter: program.clone(),
                    code: String::new(),
                    env: BTreeMap::new(),
                    files: Vec::new(),
                }
            }
            None => resolve_language(&self.config, &code.language, code.code, kubernetes)?,
        };
        if resolved.language == Language::Python
            && !kubernetes
            && let Some(cache) = self.mpl_font_cache.get()
        {
            resolved.files.push(cache.clone());
        }
        let mut env = BTreeMap::from([
            (
                "PATH".to_string(),
                "/usr/local/bin:/usr/bin:/bin".to_string(),
            ),
            ("HOME".to_string(), "/tmp".to_string()),
            ("LANG".to_string(), "C.UTF-8".to_string()),
            ("PYTHONDONTWRITEBYTECODE".to_string(), "1".to_string()),
        ]);
        // In a session the program works in its workspace, mounted at /workspace: a host
        // directory locally, the ToolSession's pod on kubernetes.
        // An image run is always a pod of its own: its image is not the session pod's.
        let session = ctx.session.as_ref().filter(|_| image.is_none());
        let tool_session = session.and_then(|s| s.tool_session.clone());
        let workspace = session
            .filter(|s| s.tool_session.is_none())
            .map(|s| s.workspace_dir.clone());
        let in_session = session.is_some();
        // Artifacts: collected by the runner. On kubernetes the operator asks for them (its
        // `artifacts` configuration) and returns them in the ToolRun's status.
        let a = &self.config.artifacts;
        let artifacts = (a.enabled && !kubernetes).then(|| ArtifactSpec {
            dir: if workspace.is_some() {
                a.session_dir.clone()
            } else {
                a.dir.clone()
            },
            max_files: a.max_files,
            max_file_bytes: a.max_file_bytes,
            max_total_bytes: a.max_total_bytes,
            changed_only: workspace.is_some(),
        });
        if let Some(a) = &artifacts {
            env.insert("TOOLRUN_OUTPUTS".into(), a.dir.clone());
        }
        env.extend(resolved.env);
        env.extend(code.env);
        let workdir = match (&code.workdir, in_session) {
            (Some(w), _) => w.clone(),
            (None, true) => crate::session::WORKSPACE_IN_SANDBOX.to_string(),
            (None, false) => "/tmp".to_string(),
        };
        let spec = RunSpec {
            language: resolved.language,
            code: resolved.code,
            args,
            env,
            stdin: code.stdin,
            interpreter: resolved.interpreter,
            workdir,
            // The one computation of the runner's limits (with the runner's own headroom
            // in the process limit), shared with the tests and benches.
            limits: crate::sandbox::runner_limits(limits, timeout.as_millis() as u64),
            setup: RunSetup {
                files: resolved.files,
                artifacts,
            },
        };
        self.metrics.sandbox_inflight.inc();
        let result = self
            .sandbox
            .run(
                SandboxRun {
                    spec,
                    language: match image {
                        Some(_) => String::new(),
                        None => code.language.as_str().to_string(),
                    },
                    limits: limits.clone(),
                    tool: code.tool.to_string(),
                    call_id: ctx.call_id.clone(),
                    tenant: ctx.tenant.clone(),
                    workspace,
                    session: tool_session,
                    image: image.map(|i| i.image),
                },
                ctx.stream.clone(),
                ctx.cancel.clone(),
            )
            .await;
        self.metrics.sandbox_inflight.dec();
        let record = result.map_err(|e| match e {
            // Nothing ran: the arguments do not fit this backend.
            SandboxError::Rejected(why) => ToolError::invalid_arguments(why),
            e => {
                self.metrics
                    .sandbox_runs
                    .get_or_create(&VerdictLabels {
                        verdict: Verdict::InfraError.as_str().into(),
                    })
                    .inc();
                ToolError::new(ErrorCode::Unavailable, format!("sandbox failure: {e}"))
            }
        })?;
        self.metrics
            .sandbox_runs
            .get_or_create(&VerdictLabels {
                verdict: record.verdict.as_str().into(),
            })
            .inc();
        let spec = spec_bounds(&self.config.artifacts);
        record_to_result(record, timeout, &spec)
    }

    /// Probes each language's interpreter and libraries once, through the sandbox itself
    /// (what a program would see), for /readyz. Bounded: one short run per language.
    pub async fn probe_languages(&self) -> serde_json::Value {
        let mut out = serde_json::Map::new();
        for name in self.config.language_names() {
            let libs = self
                .config
                .libraries
                .get(&name)
                .cloned()
                .unwrap_or_default();
            let code = probe_code(&self.config, &name, &libs);
            let ctx = CallContext::with_timeout("readyz-probe", Duration::from_secs(20));
            let run = CodeRun {
                language: LanguageArg(name.clone().into()),
                code,
                args: Vec::new(),
                env: BTreeMap::new(),
                stdin: String::new(),
                timeout: Duration::from_secs(15),
                tool: "run_code".into(),
                workdir: None,
                image: None,
            };
            let limits = self.config.limits.clone();
            let entry = match self.run(run, &limits, &ctx).await {
                Ok(o) => {
                    let mut e = serde_json::json!({"available": true});
                    if !libs.is_empty() {
                        let found: serde_json::Value = serde_json::from_str(o.stdout.trim())
                            .unwrap_or_else(|_| serde_json::json!(o.stdout.trim()));
                        e["libraries"] = found;
                    }
                    if name == "python" && e["libraries"]["matplotlib"].is_string() {
                        e["matplotlib_font_cache"] = self.warm_matplotlib().await.into();
                    }
                    e
                }
                Err(e) => serde_json::json!({"available": false, "error": e.message}),
            };
            let mut entry = entry;
            entry["kind"] = if crate::config::BUILTIN_LANGUAGES.contains(&name.as_str()) {
                "builtin".into()
            } else {
                "configured".into()
            };
            out.insert(name, entry);
        }
        serde_json::Value::Object(out)
    }
}

impl SandboxPool {
    /// Builds matplotlib's font cache once in the sandbox and keeps it for every python
    /// run; returns whether it did.
    async fn warm_matplotlib(&self) -> bool {
        let ctx = CallContext::with_timeout("mpl-font-cache", Duration::from_secs(40));
        let run = CodeRun {
            language: LanguageArg::Python,
            code: MPL_FONT_CACHE_PROBE.into(),
            args: Vec::new(),
            env: BTreeMap::new(),
            stdin: String::new(),
            timeout: Duration::from_secs(30),
            tool: "run_code".into(),
            workdir: None,
            image: None,
        };
        let Ok(out) = self.run(run, &self.config.limits.clone(), &ctx).await else {
            return false;
        };
        #[derive(Deserialize)]
        struct Cache {
            name: String,
            content: String,
        }
        let Ok(c) = serde_json::from_str::<Cache>(out.stdout.trim()) else {
            return false;
        };
        let plain = !c.name.is_empty() && !c.name.contains('/') && !c.name.starts_with('.');
        plain
            && self
                .mpl_font_cache
                .set(SetupFile {
                    path: format!("{SETUP_DIR}/matplotlib/{}", c.name),
                    content: c.content,
                })
                .is_ok()
    }
}

/// The program /readyz's probe runs in a language: python prints each library's version
/// (null when missing) as JSON; a configured language runs its `probe` program (default:
/// an empty one); javascript and bash an empty one.
fn probe_code(config: &SandboxConfig, language: &str, libs: &[String]) -> String {
    if let Some(l) = config.languages.get(language) {
        return l.probe.clone().unwrap_or_default();
    }
    match language {
        "python" => {
            let names = serde_json::to_string(libs).expect("strings serialise");
            format!(
                "import importlib.util, importlib.metadata, json\n\
                 def v(m):\n    \
                 if importlib.util.find_spec(m) is None: return None\n    \
                 try: return importlib.metadata.version(m)\n    \
                 except Exception: return 'present'\n\
                 print(json.dumps({{m: v(m) for m in {names}}}))\n"
            )
        }
        _ => String::new(),
    }
}

/// Prints matplotlib's font list cache (its file name, its content) once it is built: every
/// python run then gets it as a setup file instead of building it again (a few hundred ms
/// per run, as each run's /tmp is new).
const MPL_FONT_CACHE_PROBE: &str = "import json, os\n\
    import matplotlib as mpl, matplotlib.font_manager as fm\n\
    name = 'fontlist-v%s.json' % fm.FontManager.__version__\n\
    path = os.path.join(mpl.get_cachedir(), name)\n\
    if not os.path.exists(path): fm.json_dump(fm.fontManager, path)\n\
    print(json.dumps({'name': name, 'content': open(path).read()}))\n";

/// A language resolved for the runner.
struct Resolved {
    language: Language,
    interpreter: String,
    code: String,
    env: BTreeMap<String, String>,
    files: Vec<SetupFile>,
}

pub use toolrun_runner::interp::{MPL_BACKEND, SETUP_DIR};

fn resolve_language(
    config: &SandboxConfig,
    name: &str,
    code: String,
    kubernetes: bool,
) -> Result<Resolved, ToolError> {
    let builtin = |language: Language, path: &std::path::Path| Resolved {
        language,
        interpreter: path.to_string_lossy().into_owned(),
        code: code.clone(),
        env: BTreeMap::new(),
        files: Vec::new(),
    };
    let i = &config.interpreters;
    match name {
        "python" => {
            let mut r = builtin(Language::Python, &i.python);
            // toolrun's Agg backend, whose show() returns figures as artifacts. On
            // kubernetes the operator adds the same (the pod's spec is built there).
            if !kubernetes {
                let rc = std::path::Path::new(interp::DEBIAN_MPL_DATA)
                    .join("matplotlibrc")
                    .is_file()
                    .then_some(interp::DEBIAN_MPL_DATA);
                interp::python_matplotlib(&mut r.env, &mut r.files, rc);
            }
            return Ok(r);
        }
        "javascript" => return Ok(builtin(Language::Javascript, &i.javascript)),
        "bash" => return Ok(builtin(Language::Bash, &i.bash)),
        _ => {}
    }
    let Some(lang) = config.languages.get(name) else {
        return Err(ToolError::invalid_arguments(format!(
            "unknown language {name:?}; configured languages: {}",
            config.language_names().join(", ")
        ))
        .with_details(serde_json::json!({
            "path": "/language",
            "languages": config.language_names(),
        })));
    };
    if kubernetes {
        // The operator resolves it from its own `languages` (the chart renders both
        // configurations from the same values): the ToolRun names the language.
        return Ok(Resolved {
            language: Language::Bash,
            interpreter: String::new(),
            code,
            env: BTreeMap::new(),
            files: Vec::new(),
        });
    }
    let (code, source) = interp::configured_program(&lang.command, &lang.extension, code);
    Ok(Resolved {
        language: Language::Bash,
        interpreter: i.bash.to_string_lossy().into_owned(),
        code,
        env: lang.env.clone(),
        files: vec![source],
    })
}

/// The bounds the gateway checks a record's artifacts against.
fn spec_bounds(a: &crate::config::ArtifactsConfig) -> ArtifactSpec {
    ArtifactSpec {
        dir: a.dir.clone(),
        max_files: a.max_files,
        max_file_bytes: a.max_file_bytes,
        max_total_bytes: a.max_total_bytes,
        changed_only: false,
    }
}

/// One file a program wrote to its outputs directory, as run_code and shell return it.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct ArtifactOut {
    /// Path relative to the outputs directory (`/tmp/outputs`, or `/workspace/outputs` in
    /// a session).
    pub name: String,
    /// The file's whole size in bytes.
    pub size: u64,
    /// image/png, image/jpeg, image/svg+xml, text/plain, text/csv, application/json,
    /// application/octet-stream, ...
    pub media_type: String,
    /// The content, standard base64 (at most the per-file cap).
    pub content_base64: String,
    /// `content_base64` holds less than the whole file.
    pub truncated: bool,
}

/// An outputs entry that was not returned.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct OmittedOut {
    /// Path relative to the outputs directory.
    pub name: String,
    /// Why (a symlink, a FIFO or device, past a limit, ...).
    pub reason: String,
}

/// Checks, decodes and bounds the runner's artifacts: a record that breaks a bound (a
/// runner that was tampered with, or a bug) loses the offending files, never more than the
/// bounds reach the caller. The media type is computed again from the name and bytes.
fn artifacts_out(
    a: Option<toolrun_runner::artifacts::Artifacts>,
    bounds: &ArtifactSpec,
) -> (Vec<ArtifactOut>, Vec<OmittedOut>, bool) {
    use base64::Engine as _;
    let Some(a) = a else {
        return (Vec::new(), Vec::new(), false);
    };
    let mut truncated = a.truncated;
    let mut omitted: Vec<OmittedOut> = a
        .omitted
        .into_iter()
        .take(100)
        .map(|o| OmittedOut {
            name: o.name,
            reason: o.reason,
        })
        .collect();
    if !a.error.is_empty() {
        omitted.push(OmittedOut {
            name: ".".into(),
            reason: a.error,
        });
    }
    let mut total = 0u64;
    let mut files = Vec::new();
    for f in a.files {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(f.content_base64.as_bytes())
            .ok();
        let name_ok = !f.name.is_empty()
            && !f.name.starts_with('/')
            && !f.name.split('/').any(|c| c == ".." || c.is_empty());
        let reason = match &bytes {
            _ if !name_ok => Some("a bad name in the runner's record"),
            None => Some("content that is not base64 in the runner's record"),
            Some(b) if b.len() as u64 > bounds.max_file_bytes => Some("over the per-file limit"),
            Some(b) if total + b.len() as u64 > bounds.max_total_bytes => {
                Some("over the per-call limit")
            }
            _ if files.len() as u64 >= bounds.max_files => Some("over the file count limit"),
            _ => None,
        };
        if let Some(reason) = reason {
            truncated = true;
            omitted.push(OmittedOut {
                name: f.name,
                reason: reason.into(),
            });
            continue;
        }
        let bytes = bytes.unwrap_or_default();
        total += bytes.len() as u64;
        let head = &bytes[..bytes.len().min(512)];
        files.push(ArtifactOut {
            media_type: toolrun_runner::artifacts::media_type(&f.name, head).into(),
            truncated: f.truncated || (bytes.len() as u64) < f.size,
            name: f.name,
            size: f.size,
            content_base64: f.content_base64,
        });
    }
    (files, omitted, truncated)
}

/// Maps a runner record to run_code's output or typed failure (with the output attached).
pub fn record_to_result(
    r: RunRecord,
    timeout: Duration,
    bounds: &ArtifactSpec,
) -> Result<RunCodeOutput, ToolError> {
    let (artifacts, artifacts_omitted, artifacts_truncated) = artifacts_out(r.artifacts, bounds);
    let out = RunCodeOutput {
        stdout: r.stdout,
        stderr: r.stderr,
        exit_code: r.exit_code,
        duration_ms: r.duration_ms,
        timed_out: r.timed_out,
        stdout_truncated: r.stdout_truncated,
        stderr_truncated: r.stderr_truncated,
        artifacts,
        artifacts_omitted,
        artifacts_truncated,
    };
    let detail = |default: String| {
        if r.message.is_empty() {
            default
        } else {
            r.message.clone()
        }
    };
    let (code, message) = match r.verdict {
        Verdict::Ok => return Ok(out),
        Verdict::RuntimeError => (
            ErrorCode::ExecutionError,
            match r.signal {
                Some(sig) => format!("the program was killed by signal {sig}"),
                None => format!("the program exited with code {}", r.exit_code),
            },
        ),
        Verdict::Timeout => (
            ErrorCode::Timeout,
            // The seed's wording ("timed out") first, the runner's reason after.
            if r.message.is_empty() {
                format!("timed out after {} ms", timeout.as_millis())
            } else {
                format!("timed out: {}", r.message)
            },
        ),
        Verdict::MemoryLimit => (
            ErrorCode::MemoryLimit,
            detail("the program exceeded its memory limit".into()),
        ),
        Verdict::OutputLimit => (
            ErrorCode::OutputLimit,
            detail("the program exceeded its output limit".into()),
        ),
        Verdict::Cancelled => (ErrorCode::Cancelled, detail("the run was cancelled".into())),
        Verdict::InfraError => (ErrorCode::Unavailable, detail("the sandbox failed".into())),
    };
    let output = serde_json::to_value(&out).expect("output serialises");
    Err(ToolError::new(code, message).with_output(output))
}

/// A program to run, after argument parsing.
#[derive(Debug, Clone)]
pub struct CodeRun {
    /// Language: a built-in or a configured one.
    pub language: LanguageArg,
    /// Source.
    pub code: String,
    /// Program arguments.
    pub args: Vec<String>,
    /// Extra environment.
    pub env: BTreeMap<String, String>,
    /// Standard input.
    pub stdin: String,
    /// Wall-clock limit.
    pub timeout: Duration,
    /// The tool asking (recorded by the kubernetes backend).
    pub tool: std::borrow::Cow<'static, str>,
    /// Working directory inside the sandbox (default: `/workspace` in a session, else
    /// `/tmp`).
    pub workdir: Option<String>,
    /// Instead of `language` and `code` (both ignored then): a container image and the
    /// command run in it, a custom tool's image implementation. Kubernetes backend only;
    /// always a pod of its own (no session's workspace).
    pub image: Option<ImageCommand>,
}

/// A container image and the argv run in it (the program, then its arguments).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageCommand {
    /// Image reference.
    pub image: String,
    /// The program and its arguments; never empty.
    pub command: Vec<String>,
}

/// A language run_code accepts: python, javascript, bash, or a name from
/// `sandbox.languages` (the tool's schema lists the configured ones as an enum).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(transparent)]
pub struct LanguageArg(pub std::borrow::Cow<'static, str>);

#[allow(non_upper_case_globals)]
impl LanguageArg {
    /// Python 3.
    pub const Python: LanguageArg = LanguageArg(std::borrow::Cow::Borrowed("python"));
    /// JavaScript (Node.js).
    pub const Javascript: LanguageArg = LanguageArg(std::borrow::Cow::Borrowed("javascript"));
    /// Bash.
    pub const Bash: LanguageArg = LanguageArg(std::borrow::Cow::Borrowed("bash"));

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Default for LanguageArg {
    fn default() -> Self {
        LanguageArg::Python
    }
}

impl std::ops::Deref for LanguageArg {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

/// Arguments of `run_code`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunCodeInput {
    /// Language of `code`.
    pub language: LanguageArg,
    /// The program.
    #[schemars(length(max = 50000))]
    pub code: String,
    /// Arguments passed to the program (sys.argv[1:], process.argv.slice(2), $1...).
    #[serde(default)]
    #[schemars(length(max = 256))]
    pub args: Vec<String>,
    /// Environment variables for the program (names: letters, digits, underscore).
    #[serde(default)]
    #[schemars(extend("propertyNames" = {"pattern": "^[A-Za-z_][A-Za-z0-9_]{0,127}$"}, "maxProperties" = 128))]
    pub env: BTreeMap<String, String>,
    /// Text written to the program's standard input.
    #[serde(default)]
    #[schemars(length(max = 1048576))]
    pub stdin: Option<String>,
    /// Wall-clock limit in seconds (default 10; at most the tool's configured timeout).
    #[serde(default)]
    #[schemars(range(min = 1, max = 60))]
    pub timeout: Option<u64>,
}

/// Output of `run_code` and `code_executor`.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct RunCodeOutput {
    /// Captured standard output (at most the output limit).
    pub stdout: String,
    /// Captured standard error (at most the output limit).
    pub stderr: String,
    /// Exit status; 128 + signal number when killed by a signal.
    pub exit_code: i32,
    /// Wall-clock run time of the program.
    pub duration_ms: u64,
    /// The wall-clock limit was hit.
    pub timed_out: bool,
    /// stdout was cut at the output limit.
    pub stdout_truncated: bool,
    /// stderr was cut at the output limit.
    pub stderr_truncated: bool,
    /// Files the program wrote to its outputs directory (`/tmp/outputs`; in a session, the
    /// files of `/workspace/outputs` created or changed by this call), content in base64.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub artifacts: Vec<ArtifactOut>,
    /// Outputs entries not returned (symlinks, FIFOs, devices, past a limit), with why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub artifacts_omitted: Vec<OmittedOut>,
    /// Files were left out or cut by the artifact limits.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub artifacts_truncated: bool,
}

/// The `run_code` tool.
pub struct RunCode {
    pool: Arc<SandboxPool>,
    limits: Limits,
    default_timeout: Duration,
    max_timeout: Duration,
}

impl RunCode {
    /// run_code over `pool`, with `limits` and the configured call timeout as its ceiling.
    pub fn new(pool: Arc<SandboxPool>, limits: Limits, max_timeout: Duration) -> Self {
        let default_timeout = Duration::from_secs(pool.config.default_timeout_seconds);
        RunCode {
            pool,
            limits,
            default_timeout,
            max_timeout,
        }
    }

    fn timeout(&self, seconds: Option<u64>) -> Result<Duration, ToolError> {
        let Some(s) = seconds else {
            return Ok(self.default_timeout.min(self.max_timeout));
        };
        let t = Duration::from_secs(s);
        if t > self.max_timeout {
            return Err(ToolError::invalid_arguments(format!(
                "timeout {s} s exceeds this tool's maximum of {} s",
                self.max_timeout.as_secs()
            ))
            .with_details(
                serde_json::json!({"path": "/timeout", "maximum": self.max_timeout.as_secs()}),
            ));
        }
        Ok(t)
    }
}

fn run_code_metadata(id: &'static str, name: &'static str) -> ToolMetadata {
    ToolMetadata {
        id: id.into(),
        name: name.into(),
        description: "Runs a Python, JavaScript (Node.js) or Bash program in an isolated sandbox \
            with no network, a read-only filesystem except a small private /tmp, and limits on \
            time, memory, processes and output. Returns stdout, stderr and the exit code. With \
            a session_id the program runs in the session's workspace (/workspace, read-write, \
            its working directory)."
            .into(),
        version: "1.0.0",
        category: Category::Execution,
        sandbox_required: true,
        side_effect: SideEffect::Impure,
        determinism: Determinism::NonDeterministic,
        required_capabilities: &["execute"],
        // Outside a session nothing persists; in one the program can change the workspace
        // like a shell command, so it asks as shell does.
        approval: ApprovalPolicy::Conditional,
        max_memory_bytes: None,
    }
}

/// The approval a program asks for in a session (none outside one).
pub fn execute_ask(ctx: &CallContext, what: &str, code: &str) -> Option<ApprovalAsk> {
    ctx.session.as_ref()?;
    let mut shown: String = code.chars().take(4000).collect();
    if shown.len() < code.len() {
        shown.push_str("\n... (cut)");
    }
    Some(ApprovalAsk {
        kind: ApprovalKind::Execute,
        reason: format!("{what} in the session's workspace:\n{shown}"),
    })
}

impl TypedTool for RunCode {
    type Input = RunCodeInput;
    type Output = RunCodeOutput;

    fn metadata(&self) -> ToolMetadata {
        let mut m = run_code_metadata("run_code", "Run Code");
        m.max_memory_bytes = Some(self.limits.memory_mb * 1024 * 1024);
        m
    }

    fn default_timeout_ms(&self) -> u64 {
        RUN_CODE_TIMEOUT_MS
    }

    async fn approval(
        &self,
        input: &RunCodeInput,
        _args: &serde_json::Value,
        ctx: &CallContext,
    ) -> Result<Option<ApprovalAsk>, ToolError> {
        let what = format!("run {} code", input.language.as_str());
        Ok(execute_ask(ctx, &what, &input.code))
    }

    async fn run(
        &self,
        input: RunCodeInput,
        ctx: &CallContext,
    ) -> Result<RunCodeOutput, ToolError> {
        let run = CodeRun {
            language: input.language,
            code: input.code,
            args: input.args,
            env: input.env,
            stdin: input.stdin.unwrap_or_default(),
            timeout: self.timeout(input.timeout)?,
            tool: "run_code".into(),
            workdir: None,
            image: None,
        };
        self.pool.run(run, &self.limits, ctx).await
    }
}

/// Arguments of `code_executor` (seed 000's shape).
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CodeExecutorInput {
    /// The program.
    #[schemars(length(max = 50000))]
    pub code: String,
    /// Language of `code` (default python).
    #[serde(default)]
    pub language: LanguageArg,
    /// Wall-clock limit in seconds (default 10).
    #[serde(default)]
    #[schemars(range(min = 1, max = 30))]
    pub timeout_seconds: Option<u64>,
}

/// `code_executor`: seed 000's code executor, on the same sandbox as run_code.
pub struct CodeExecutor(pub RunCode);

impl TypedTool for CodeExecutor {
    type Input = CodeExecutorInput;
    type Output = RunCodeOutput;

    fn metadata(&self) -> ToolMetadata {
        let mut m = run_code_metadata("code_executor", "Code Executor");
        m.description = "Executes code in a secure sandbox (seed shape of run_code: code, \
            language, timeout_seconds)."
            .into();
        m.max_memory_bytes = Some(self.0.limits.memory_mb * 1024 * 1024);
        m
    }

    fn default_timeout_ms(&self) -> u64 {
        RUN_CODE_TIMEOUT_MS
    }

    async fn approval(
        &self,
        input: &CodeExecutorInput,
        _args: &serde_json::Value,
        ctx: &CallContext,
    ) -> Result<Option<ApprovalAsk>, ToolError> {
        let what = format!("run {} code", input.language.as_str());
        Ok(execute_ask(ctx, &what, &input.code))
    }

    async fn run(
        &self,
        input: CodeExecutorInput,
        ctx: &CallContext,
    ) -> Result<RunCodeOutput, ToolError> {
        let run = CodeRun {
            language: input.language,
            code: input.code,
            args: Vec::new(),
            env: BTreeMap::new(),
            stdin: String::new(),
            timeout: self.0.timeout(input.timeout_seconds)?,
            tool: "code_executor".into(),
            workdir: None,
            image: None,
        };
        self.0.pool.run(run, &self.0.limits, ctx).await
    }
}

/// `tool` (run_code or code_executor, wrapped by [`crate::tool::typed`]) with its schema's
/// `language` an enum of the configured languages: a model sees exactly what it may ask
/// for, and an unknown name is refused by the schema check (INVALID_ARGUMENTS naming them).
pub fn with_language_enum(
    tool: Arc<dyn crate::tool::Tool>,
    config: &SandboxConfig,
) -> Arc<dyn crate::tool::Tool> {
    let mut input_schema = tool.input_schema().clone();
    let names = config.language_names();
    if let Some(lang) = input_schema.pointer_mut("/properties/language") {
        lang["enum"] = serde_json::json!(names);
        // The schema check's message for `enum` names only the first two values; the
        // pattern's message names them all, so a refused call lists every language.
        lang["pattern"] = format!("^(?:{})$", names.join("|")).into();
        lang["description"] = format!("Language of `code`: one of {}.", names.join(", ")).into();
    }
    Arc::new(LanguageEnum { tool, input_schema })
}

struct LanguageEnum {
    tool: Arc<dyn crate::tool::Tool>,
    input_schema: serde_json::Value,
}

#[async_trait::async_trait]
impl crate::tool::Tool for LanguageEnum {
    fn metadata(&self) -> &ToolMetadata {
        self.tool.metadata()
    }

    fn input_schema(&self) -> &serde_json::Value {
        &self.input_schema
    }

    fn output_schema(&self) -> &serde_json::Value {
        self.tool.output_schema()
    }

    async fn call(
        &self,
        args: serde_json::Value,
        ctx: &CallContext,
    ) -> Result<serde_json::Value, ToolError> {
        self.tool.call(args, ctx).await
    }

    fn default_timeout_ms(&self) -> u64 {
        self.tool.default_timeout_ms()
    }

    async fn approval(
        &self,
        args: &serde_json::Value,
        ctx: &CallContext,
    ) -> Result<Option<ApprovalAsk>, ToolError> {
        self.tool.approval(args, ctx).await
    }
}
