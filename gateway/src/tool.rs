//! The tool abstraction: metadata, schemas, and the call interface every tool implements.

use std::borrow::Cow;
use std::future::Future;
use std::sync::Arc;

use async_trait::async_trait;
use schemars::JsonSchema;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::approval::{ApprovalAsk, ApprovalInfo, ApprovalKind};
use crate::error::{ErrorCode, ToolError};
use crate::session::Session;

/// What a tool is for (seed 000's categories plus `filesystem`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Category {
    /// Pure computation (calculator, hash).
    Computation,
    /// Runs code or commands.
    Execution,
    /// Looks things up.
    Search,
    /// Agent memory.
    Memory,
    /// Small helpers (echo).
    Utility,
    /// Workspace files.
    Filesystem,
}

/// Whether a call changes anything outside its own result (seed 003).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SideEffect {
    /// No side effects: safe to retry and cache.
    Pure,
    /// Has side effects.
    Impure,
}

/// How repeatable a call is (seed 003).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Determinism {
    /// Same input, same output.
    Deterministic,
    /// Uses injected time or randomness; repeatable with the same context.
    Bounded,
    /// Depends on the outside world.
    NonDeterministic,
}

/// Whether a call needs a human's approval first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ApprovalPolicy {
    /// Runs without approval.
    Never,
    /// Every call needs approval.
    Always,
    /// Depends on the arguments (write_file and move_file when they would overwrite,
    /// run_code in a session).
    Conditional,
}

/// Static facts about a tool, declared by its implementation. Built-ins borrow their
/// strings; custom tools (declared in the configuration or as `Tool` resources) own them.
#[derive(Debug, Clone, Serialize)]
pub struct ToolMetadata {
    /// Stable id, e.g. `calculator`; the name models call.
    pub id: Cow<'static, str>,
    /// Display name, e.g. `Calculator`.
    pub name: Cow<'static, str>,
    /// What the tool does, written for a model.
    pub description: Cow<'static, str>,
    /// Semantic version of the tool's contract.
    pub version: &'static str,
    /// Category.
    pub category: Category,
    /// Runs untrusted input in a sandbox.
    pub sandbox_required: bool,
    /// Side effects.
    pub side_effect: SideEffect,
    /// Determinism.
    pub determinism: Determinism,
    /// Capabilities the caller's tenant must hold (seed 003): `execute` (runs programs),
    /// `filesystem.read`, `filesystem.write` (workspace files), `network`.
    pub required_capabilities: &'static [&'static str],
    /// Default approval policy.
    pub approval: ApprovalPolicy,
    /// Most memory a call may use, when the tool bounds it.
    pub max_memory_bytes: Option<u64>,
}

impl ToolMetadata {
    /// Metadata of an inline, pure, deterministic tool (version 1.0.0, no capabilities, no
    /// approval, no sandbox): the shape of every built-in inline tool.
    pub const fn pure_inline(
        id: &'static str,
        name: &'static str,
        description: &'static str,
        category: Category,
    ) -> Self {
        ToolMetadata {
            id: Cow::Borrowed(id),
            name: Cow::Borrowed(name),
            description: Cow::Borrowed(description),
            version: "1.0.0",
            category,
            sandbox_required: false,
            side_effect: SideEffect::Pure,
            determinism: Determinism::Deterministic,
            required_capabilities: &[],
            approval: ApprovalPolicy::Never,
            max_memory_bytes: None,
        }
    }
}

/// Behaviour hints a tool declares itself (MCP's tool annotations); tools without them get
/// hints derived from their metadata.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Hints {
    /// Changes nothing.
    pub read_only: bool,
    /// May destroy or overwrite things (asks for approval in a session).
    pub destructive: bool,
    /// Calling again with the same arguments has no further effect.
    pub idempotent: bool,
    /// Reaches things beyond the gateway and its sandbox.
    pub open_world: bool,
}

/// A chunk of live output from a running tool (for `StreamTool`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamChunk {
    /// Program stdout.
    Stdout(String),
    /// Program stderr.
    Stderr(String),
    /// The call waits for this approval (sent before the tool runs).
    Approval(Box<ApprovalInfo>),
}

/// Per-call context handed to a tool.
#[derive(Debug, Clone)]
pub struct CallContext {
    /// The caller's call id (or one the gateway made).
    pub call_id: String,
    /// The caller's session id (may be empty).
    pub session_id: String,
    /// When the call must be finished; tools that start work outside the process
    /// (sandboxes) must stop it by then.
    pub deadline: Instant,
    /// Fired when the caller goes away or the server shuts down.
    pub cancel: CancellationToken,
    /// Where to send live output, when the caller streams.
    pub stream: Option<mpsc::Sender<StreamChunk>>,
    /// The session the call runs in, when it names one.
    pub session: Option<Arc<Session>>,
    /// The caller's tenant (empty: anonymous); remote backends label their runs with it.
    pub tenant: String,
}

impl CallContext {
    /// The call's session, or INVALID_ARGUMENTS saying the tool needs one.
    pub fn require_session(&self, tool: &str) -> Result<&Arc<Session>, ToolError> {
        self.session.as_ref().ok_or_else(|| {
            ToolError::invalid_arguments(format!(
                "{tool} works on a session's workspace: create a session (CreateSession, \
                 `toolrun session create`) and pass its id as session_id"
            ))
        })
    }
}

impl CallContext {
    /// A context with a deadline `timeout` from now, no streaming, fresh cancellation.
    pub fn with_timeout(call_id: impl Into<String>, timeout: std::time::Duration) -> Self {
        CallContext {
            call_id: call_id.into(),
            session_id: String::new(),
            deadline: Instant::now() + timeout,
            cancel: CancellationToken::new(),
            stream: None,
            session: None,
            tenant: String::new(),
        }
    }
}

/// A tool as the registry and executor see it: JSON in, JSON out.
///
/// Most tools implement [`TypedTool`] instead and are wrapped with [`typed`].
#[async_trait]
pub trait Tool: Send + Sync + 'static {
    /// Static metadata.
    fn metadata(&self) -> &ToolMetadata;
    /// JSON Schema of the arguments.
    fn input_schema(&self) -> &Value;
    /// JSON Schema of the output.
    fn output_schema(&self) -> &Value;
    /// Runs the call. `args` has already passed [`Tool::input_schema`].
    async fn call(&self, args: Value, ctx: &CallContext) -> Result<Value, ToolError>;
    /// Timeout when the configuration sets none.
    fn default_timeout_ms(&self) -> u64 {
        crate::config::DEFAULT_TIMEOUT_MS
    }
    /// Hints the tool declares; `None` (the built-ins) derives them from the metadata.
    fn hints(&self) -> Option<Hints> {
        None
    }
    /// What this call asks its approver under the tool's own policy (a session in mode
    /// `safe`); `None` runs without asking. `args` has passed the input schema.
    async fn approval(
        &self,
        args: &Value,
        ctx: &CallContext,
    ) -> Result<Option<ApprovalAsk>, ToolError>;
}

/// The approval a tool's metadata implies: none for `Never`, otherwise a plain one of the
/// kind its category suggests (tools with a better reason override
/// [`TypedTool::approval`]).
pub fn default_ask(m: &ToolMetadata, args: &Value) -> Option<ApprovalAsk> {
    match m.approval {
        ApprovalPolicy::Never => None,
        ApprovalPolicy::Always | ApprovalPolicy::Conditional => Some(plain_ask(m, args)),
    }
}

/// An approval naming the tool and its arguments, of the kind its metadata suggests: what
/// mode `none` asks of tools that never ask on their own.
pub fn plain_ask(m: &ToolMetadata, args: &Value) -> ApprovalAsk {
    let kind = match (m.category, m.side_effect) {
        (Category::Execution, _) => ApprovalKind::Execute,
        (_, SideEffect::Pure) => ApprovalKind::Read,
        _ => ApprovalKind::Write,
    };
    let mut text = args.to_string();
    if text.len() > 2000 {
        let mut end = 2000;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push_str("...");
    }
    ApprovalAsk {
        kind,
        reason: format!("{} with {text}", m.id),
    }
}

/// A tool with typed input and output; schemas come from the Rust types (schemars).
pub trait TypedTool: Send + Sync + 'static {
    /// Arguments.
    type Input: DeserializeOwned + JsonSchema + Send + Sync;
    /// Output.
    type Output: Serialize + JsonSchema;
    /// Static metadata.
    fn metadata(&self) -> ToolMetadata;
    /// Timeout when the configuration sets none.
    fn default_timeout_ms(&self) -> u64 {
        crate::config::DEFAULT_TIMEOUT_MS
    }
    /// Runs the call.
    fn run(
        &self,
        input: Self::Input,
        ctx: &CallContext,
    ) -> impl Future<Output = Result<Self::Output, ToolError>> + Send;
    /// What this call asks its approver under the tool's own policy; the default follows
    /// [`ToolMetadata::approval`] ([`default_ask`]).
    fn approval(
        &self,
        input: &Self::Input,
        args: &Value,
        ctx: &CallContext,
    ) -> impl Future<Output = Result<Option<ApprovalAsk>, ToolError>> + Send {
        let _ = (input, ctx);
        let ask = default_ask(&self.metadata(), args);
        async move { Ok(ask) }
    }
}

/// JSON Schema (draft 2020-12) of a Rust type, as generated by schemars.
pub fn schema_of<T: JsonSchema>() -> Value {
    serde_json::to_value(schemars::schema_for!(T)).expect("schemas always serialise")
}

/// Wraps a [`TypedTool`] as a [`Tool`].
pub fn typed<T: TypedTool>(tool: T) -> Arc<dyn Tool> {
    Arc::new(Typed {
        metadata: tool.metadata(),
        input_schema: schema_of::<T::Input>(),
        output_schema: schema_of::<T::Output>(),
        tool,
    })
}

struct Typed<T> {
    tool: T,
    metadata: ToolMetadata,
    input_schema: Value,
    output_schema: Value,
}

#[async_trait]
impl<T: TypedTool> Tool for Typed<T> {
    fn metadata(&self) -> &ToolMetadata {
        &self.metadata
    }

    fn input_schema(&self) -> &Value {
        &self.input_schema
    }

    fn output_schema(&self) -> &Value {
        &self.output_schema
    }

    fn default_timeout_ms(&self) -> u64 {
        self.tool.default_timeout_ms()
    }

    async fn approval(
        &self,
        args: &Value,
        ctx: &CallContext,
    ) -> Result<Option<ApprovalAsk>, ToolError> {
        // A tool that never asks needs no second parse of its arguments.
        if self.metadata.approval == ApprovalPolicy::Never {
            return Ok(None);
        }
        let input: T::Input = serde_json::from_value(args.clone())
            .map_err(|e| ToolError::invalid_arguments(e.to_string()))?;
        self.tool.approval(&input, args, ctx).await
    }

    async fn call(&self, args: Value, ctx: &CallContext) -> Result<Value, ToolError> {
        // The schema already passed, so a failure here means the schema and the type disagree
        // (e.g. a number range the schema cannot express): still the caller's arguments.
        let input: T::Input = serde_json::from_value(args)
            .map_err(|e| ToolError::invalid_arguments(e.to_string()))?;
        let output = self.tool.run(input, ctx).await?;
        serde_json::to_value(output).map_err(|e| {
            ToolError::new(
                ErrorCode::Internal,
                format!("output does not serialise: {e}"),
            )
        })
    }
}
