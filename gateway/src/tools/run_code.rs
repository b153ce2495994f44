//! `run_code` (and the seed's `code_executor` shape): untrusted code in a sandbox.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tokio::sync::Semaphore;
use tokio::time::Instant;
use toolrun_runner::{Language, RunRecord, RunSpec, Verdict};

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
        let interpreter = match code.language {
            Language::Python => &self.config.interpreters.python,
            Language::Javascript => &self.config.interpreters.javascript,
            Language::Bash => &self.config.interpreters.bash,
        };
        let mut env = BTreeMap::from([
            (
                "PATH".to_string(),
                "/usr/local/bin:/usr/bin:/bin".to_string(),
            ),
            ("HOME".to_string(), "/tmp".to_string()),
            ("LANG".to_string(), "C.UTF-8".to_string()),
            ("PYTHONDONTWRITEBYTECODE".to_string(), "1".to_string()),
        ]);
        env.extend(code.env);
        // In a session the program works in its workspace, mounted at /workspace.
        let workspace = ctx.session.as_ref().map(|s| s.workspace_dir.clone());
        let workdir = match (&code.workdir, &workspace) {
            (Some(w), _) => w.clone(),
            (None, Some(_)) => crate::session::WORKSPACE_IN_SANDBOX.to_string(),
            (None, None) => "/tmp".to_string(),
        };
        let spec = RunSpec {
            language: code.language,
            code: code.code,
            args: code.args,
            env,
            stdin: code.stdin,
            interpreter: interpreter.to_string_lossy().into_owned(),
            workdir,
            // The one computation of the runner's limits (with the runner's own headroom
            // in the process limit), shared with the tests and benches.
            limits: crate::sandbox::runner_limits(limits, timeout.as_millis() as u64),
        };
        self.metrics.sandbox_inflight.inc();
        let result = self
            .sandbox
            .run(
                SandboxRun {
                    spec,
                    limits: limits.clone(),
                    tool: code.tool.to_string(),
                    call_id: ctx.call_id.clone(),
                    workspace,
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
        record_to_result(record, timeout)
    }
}

/// Maps a runner record to run_code's output or typed failure (with the output attached).
pub fn record_to_result(r: RunRecord, timeout: Duration) -> Result<RunCodeOutput, ToolError> {
    let out = RunCodeOutput {
        stdout: r.stdout,
        stderr: r.stderr,
        exit_code: r.exit_code,
        duration_ms: r.duration_ms,
        timed_out: r.timed_out,
        stdout_truncated: r.stdout_truncated,
        stderr_truncated: r.stderr_truncated,
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
    /// Language.
    pub language: Language,
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
    pub tool: &'static str,
    /// Working directory inside the sandbox (default: `/workspace` in a session, else
    /// `/tmp`).
    pub workdir: Option<String>,
}

/// Languages run_code accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema, Default)]
#[serde(rename_all = "lowercase")]
pub enum LanguageArg {
    /// Python 3.
    #[default]
    Python,
    /// JavaScript (Node.js).
    Javascript,
    /// Bash.
    Bash,
}

impl From<LanguageArg> for Language {
    fn from(l: LanguageArg) -> Language {
        match l {
            LanguageArg::Python => Language::Python,
            LanguageArg::Javascript => Language::Javascript,
            LanguageArg::Bash => Language::Bash,
        }
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
        id,
        name,
        description: "Runs a Python, JavaScript (Node.js) or Bash program in an isolated sandbox \
            with no network, a read-only filesystem except a small private /tmp, and limits on \
            time, memory, processes and output. Returns stdout, stderr and the exit code. With \
            a session_id the program runs in the session's workspace (/workspace, read-write, \
            its working directory).",
        version: "1.0.0",
        category: Category::Execution,
        sandbox_required: true,
        side_effect: SideEffect::Impure,
        determinism: Determinism::NonDeterministic,
        required_capabilities: &[],
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
        let what = format!("run {} code", Language::from(input.language).as_str());
        Ok(execute_ask(ctx, &what, &input.code))
    }

    async fn run(
        &self,
        input: RunCodeInput,
        ctx: &CallContext,
    ) -> Result<RunCodeOutput, ToolError> {
        let run = CodeRun {
            language: input.language.into(),
            code: input.code,
            args: input.args,
            env: input.env,
            stdin: input.stdin.unwrap_or_default(),
            timeout: self.timeout(input.timeout)?,
            tool: "run_code",
            workdir: None,
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
            language, timeout_seconds).";
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
        let what = format!("run {} code", Language::from(input.language).as_str());
        Ok(execute_ask(ctx, &what, &input.code))
    }

    async fn run(
        &self,
        input: CodeExecutorInput,
        ctx: &CallContext,
    ) -> Result<RunCodeOutput, ToolError> {
        let run = CodeRun {
            language: input.language.into(),
            code: input.code,
            args: Vec::new(),
            env: BTreeMap::new(),
            stdin: String::new(),
            timeout: self.0.timeout(input.timeout_seconds)?,
            tool: "code_executor",
            workdir: None,
        };
        self.0.pool.run(run, &self.0.limits, ctx).await
    }
}
