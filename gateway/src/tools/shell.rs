//! `shell`: a command line run by `bash -c` in a session's workspace, with every isolation
//! of run_code (seed 001's `shell`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use schemars::JsonSchema;
use serde::Deserialize;

use super::run_code::{CodeRun, LanguageArg, RunCodeOutput, SandboxPool, execute_ask};
use crate::approval::ApprovalAsk;
use crate::config::{Limits, MAX_SHELL_TIMEOUT_MS};
use crate::error::ToolError;
use crate::session::WORKSPACE_IN_SANDBOX;
use crate::tool::{
    ApprovalPolicy, CallContext, Category, Determinism, SideEffect, ToolMetadata, TypedTool,
};

/// The command's timeout when the call gives none (ms).
pub const DEFAULT_SHELL_TIMEOUT_MS: u64 = 120_000;

/// Arguments of `shell`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ShellInput {
    /// The command line, run by `bash -c` in the workspace.
    #[schemars(length(min = 1, max = 100000))]
    pub command: String,
    /// Timeout in milliseconds (default 120000, at most 600000 and the tool's configured
    /// timeout). On timeout every process the command started is killed.
    #[serde(default)]
    #[schemars(range(min = 1, max = 600000))]
    pub timeout: Option<u64>,
    /// Working directory: relative to the workspace root, or absolute under /workspace
    /// (default: the root).
    #[serde(default)]
    pub cwd: Option<String>,
}

/// The `shell` tool.
pub struct Shell {
    pool: Arc<SandboxPool>,
    limits: Limits,
    max_timeout: Duration,
}

impl Shell {
    /// shell over `pool` with `limits`; `max_timeout` is its configured call timeout.
    pub fn new(pool: Arc<SandboxPool>, limits: Limits, max_timeout: Duration) -> Self {
        Shell {
            pool,
            limits,
            max_timeout,
        }
    }
}

impl TypedTool for Shell {
    type Input = ShellInput;
    type Output = RunCodeOutput;

    fn metadata(&self) -> ToolMetadata {
        ToolMetadata {
            id: "shell".into(),
            name: "Shell".into(),
            description: "Runs a shell command (bash -c) in the session's workspace \
                (/workspace, its working directory) inside the same sandbox as run_code: no \
                network, read-only system files, limits on time, memory, processes and \
                output. Returns stdout, stderr, the exit code and the duration. Needs a \
                session_id; asks for approval unless the session's mode is `all`."
                .into(),
            version: "1.0.0",
            category: Category::Execution,
            sandbox_required: true,
            side_effect: SideEffect::Impure,
            determinism: Determinism::NonDeterministic,
            required_capabilities: &["execute"],
            approval: ApprovalPolicy::Always,
            max_memory_bytes: Some(self.limits.memory_mb << 20),
        }
    }

    fn default_timeout_ms(&self) -> u64 {
        MAX_SHELL_TIMEOUT_MS
    }

    async fn approval(
        &self,
        input: &ShellInput,
        _args: &serde_json::Value,
        ctx: &CallContext,
    ) -> Result<Option<ApprovalAsk>, ToolError> {
        let what = match &input.cwd {
            Some(cwd) => format!("run a shell command (in {cwd})"),
            None => "run a shell command".to_string(),
        };
        Ok(execute_ask(ctx, &what, &input.command))
    }

    async fn run(&self, input: ShellInput, ctx: &CallContext) -> Result<RunCodeOutput, ToolError> {
        let session = ctx.require_session("shell")?.clone();
        let asked = Duration::from_millis(input.timeout.unwrap_or(DEFAULT_SHELL_TIMEOUT_MS));
        if asked > self.max_timeout {
            return Err(ToolError::invalid_arguments(format!(
                "timeout {} ms exceeds this tool's maximum of {} ms",
                asked.as_millis(),
                self.max_timeout.as_millis()
            ))
            .with_details(serde_json::json!({
                "path": "/timeout",
                "maximum": self.max_timeout.as_millis() as u64
            })));
        }
        let workdir = match input.cwd.as_deref() {
            None | Some("") | Some(".") => WORKSPACE_IN_SANDBOX.to_string(),
            Some(cwd) => {
                let rel = session.files.resolve_dir(cwd).await?;
                if rel.is_empty() {
                    WORKSPACE_IN_SANDBOX.to_string()
                } else {
                    format!("{WORKSPACE_IN_SANDBOX}/{rel}")
                }
            }
        };
        let run = CodeRun {
            language: LanguageArg::Bash,
            code: input.command,
            args: Vec::new(),
            env: BTreeMap::new(),
            stdin: String::new(),
            timeout: asked,
            tool: "shell".into(),
            workdir: Some(workdir),
            image: None,
        };
        self.pool.run(run, &self.limits, ctx).await
    }
}
