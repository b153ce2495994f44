//! The per-call flow (DESIGN.md "Execution flow", seed 003): look up -> the tenant's
//! allowed tools and capability check -> resource check (the tenant's calls per minute)
//! -> validate arguments -> session (the tenant's own) and approval -> the tenant's
//! sandboxed-run slot -> execute with timeout -> validate and normalise output -> hash ->
//! audit (with the tenant) -> result. Every failure becomes a typed result; nothing here
//! returns an RPC error. The caller's tenant comes in [`CallRequest::tenant`], resolved
//! once per request by the front door's auth layer ([`crate::auth`]).

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::approval::{ApprovalInfo, Approvals, DecideError, Decision, WaitOutcome};
use crate::audit::{AuditRecord, AuditSink};
use crate::auth::{LimitError, Tenant};
use crate::canonical::{blake3_hex, canonical_with_hash};
use crate::config::ApprovalMode;
use crate::error::{ErrorCode, ToolError};
use crate::metrics::{CallLabels, Metrics, ToolLabels};
use crate::registry::{Entry, Registry};
use crate::session::{SessionError, SessionManager};
use crate::tool::{CallContext, Determinism, StreamChunk, plain_ask};

/// Buffered live events per streaming call; a slow reader loses output chunks (the final
/// result still carries the captured output) rather than stalling the sandbox.
pub const STREAM_BUFFER: usize = 256;

/// Most approval rounds for one call (modified arguments that need a stronger approval
/// ask again).
const MAX_APPROVAL_ROUNDS: usize = 3;

/// Extra time a sandboxed tool gets past its own deadline to report a TIMEOUT result
/// with the output it captured, before the executor gives up on it.
const SANDBOX_GRACE: Duration = Duration::from_secs(3);

/// Most validation errors listed in one INVALID_ARGUMENTS result.
const MAX_REPORTED_ERRORS: usize = 8;

/// One call, as received.
#[derive(Debug, Clone, Default)]
pub struct CallRequest {
    /// Caller's id; one is made when empty.
    pub call_id: String,
    /// Tool id or alias.
    pub tool: String,
    /// Arguments as JSON text (empty = `{}`).
    pub arguments_json: String,
    /// Caller's upper bound in ms (0 = the tool's timeout).
    pub timeout_ms: u32,
    /// Caller's session.
    pub session_id: String,
    /// The caller's tenant (`None`: the anonymous tenant of a gateway without keys).
    pub tenant: Option<Arc<Tenant>>,
}

impl CallRequest {
    /// The caller's tenant.
    pub fn tenant(&self) -> Arc<Tenant> {
        self.tenant.clone().unwrap_or_else(Tenant::anonymous)
    }
}

/// One call's result.
#[derive(Debug, Clone, PartialEq)]
pub struct CallOutcome {
    /// The call id.
    pub call_id: String,
    /// Canonical tool id (or the name asked for, when unknown).
    pub tool: String,
    /// Output as RFC 8785 canonical JSON, when there is output.
    pub output_json: Option<String>,
    /// Lowercase hex BLAKE3 of `output_json` (empty without output).
    pub output_hash: String,
    /// Set when the call failed.
    pub error: Option<ToolError>,
    /// Wall-clock time in the gateway.
    pub duration: Duration,
}

impl CallOutcome {
    /// The call succeeded.
    pub fn ok(&self) -> bool {
        self.error.is_none()
    }
}

/// Runs calls against a registry.
pub struct Executor {
    /// Swapped whole when custom tools change; a call keeps the entry it looked up.
    registry: arc_swap::ArcSwap<Registry>,
    metrics: Arc<Metrics>,
    /// How long past its deadline a sandboxed tool may take to report.
    sandbox_grace: Duration,
    sessions: Option<Arc<SessionManager>>,
    approvals: Arc<Approvals>,
    audit: Option<Arc<AuditSink>>,
}

/// What a started call reports: live output and approvals, then its outcome.
#[derive(Debug)]
pub enum CallEvent {
    /// Live output, or the approval the call waits for.
    Chunk(StreamChunk),
    /// The call's result (always the last event).
    Done(CallOutcome),
}

/// A call started by [`Executor::start`]. Dropping it cancels the call (which kills its
/// sandbox): every front door gets "client gone = call cancelled" from here.
pub struct CallHandle {
    events: Option<mpsc::Receiver<StreamChunk>>,
    done: Option<tokio::sync::oneshot::Receiver<CallOutcome>>,
    /// The outcome once received, returned after the chunks sent before it.
    outcome: Option<CallOutcome>,
    call_id: String,
    tool: String,
    _cancel: tokio_util::sync::DropGuard,
}

impl CallHandle {
    /// The call's id (the caller's, or the one the gateway made).
    pub fn call_id(&self) -> &str {
        &self.call_id
    }

    /// The next event; `None` after [`CallEvent::Done`]. Cancel-safe: dropping the future
    /// loses nothing.
    pub async fn next(&mut self) -> Option<CallEvent> {
        if self.outcome.is_none() {
            let done = self.done.as_mut()?;
            // The outcome is taken the moment the call's task sends it (a oneshot receiver
            // answers once: polling it again would panic), and kept until every chunk sent
            // before it has been returned.
            let sent = match self.events.as_mut() {
                Some(rx) => tokio::select! {
                    biased;
                    chunk = rx.recv() => match chunk {
                        Some(c) => return Some(CallEvent::Chunk(c)),
                        None => {
                            self.events = None;
                            done.await
                        }
                    },
                    sent = &mut *done => sent,
                },
                None => done.await,
            };
            self.done = None;
            self.outcome = Some(sent.unwrap_or_else(|_| CallOutcome {
                call_id: self.call_id.clone(),
                tool: self.tool.clone(),
                output_json: None,
                output_hash: String::new(),
                // The executor catches tool panics; this is a bug in toolrun itself.
                error: Some(ToolError::new(
                    ErrorCode::Internal,
                    "the call's task ended without a result",
                )),
                duration: Duration::ZERO,
            }));
        }
        // The call ended: chunks it sent just before come first (a sender kept by a task
        // that outlives the call must not hold the result back, so no waiting here).
        if let Some(rx) = self.events.as_mut()
            && let Ok(c) = rx.try_recv()
        {
            return Some(CallEvent::Chunk(c));
        }
        self.events = None;
        self.outcome.take().map(CallEvent::Done)
    }

    /// Waits for the outcome, ignoring live events.
    pub async fn outcome(mut self) -> CallOutcome {
        self.events = None;
        loop {
            if let Some(CallEvent::Done(o)) = self.next().await {
                return o;
            }
        }
    }
}

/// Why a decision on an approval was refused.
#[derive(Debug, thiserror::Error)]
pub enum DecideFailure {
    /// No pending approval has that id.
    #[error(transparent)]
    NotFound(#[from] DecideError),
    /// The modified arguments are not valid for the tool.
    #[error("{0}")]
    InvalidArguments(String),
}

impl Executor {
    /// An executor over `registry`, recording into `metrics`.
    pub fn new(registry: Arc<Registry>, metrics: Arc<Metrics>) -> Self {
        Executor {
            registry: arc_swap::ArcSwap::new(registry),
            metrics,
            sandbox_grace: SANDBOX_GRACE,
            sessions: None,
            approvals: Arc::new(Approvals::new()),
            audit: None,
        }
    }

    /// Also appends every call's audit event to `audit` (the durable JSON-lines file).
    pub fn with_audit(mut self, audit: Option<Arc<AuditSink>>) -> Self {
        self.audit = audit;
        self
    }

    /// Serves sessions from `sessions` (and approvals from its table).
    pub fn with_sessions(mut self, sessions: Arc<SessionManager>) -> Self {
        self.approvals = sessions.approvals().clone();
        self.sessions = Some(sessions);
        self
    }

    /// Serves sessions from `sessions` when given.
    pub fn with_sessions_opt(self, sessions: Option<Arc<SessionManager>>) -> Self {
        match sessions {
            Some(s) => self.with_sessions(s),
            None => self,
        }
    }

    /// The session manager, when sessions are served.
    pub fn sessions(&self) -> Option<&Arc<SessionManager>> {
        self.sessions.as_ref()
    }

    /// The pending approvals.
    pub fn approvals(&self) -> &Arc<Approvals> {
        &self.approvals
    }

    /// Starts one call on its own task; the handle streams its events (when `stream`)
    /// and its outcome. `parent` cancels it (server shutdown); so does dropping the handle.
    pub fn start(
        self: &Arc<Self>,
        mut req: CallRequest,
        parent: &CancellationToken,
        stream: bool,
    ) -> CallHandle {
        if req.call_id.is_empty() {
            req.call_id = uuid::Uuid::new_v4().to_string();
        }
        let cancel = parent.child_token();
        let (tx, rx) = if stream {
            let (tx, rx) = mpsc::channel(STREAM_BUFFER);
            (Some(tx), Some(rx))
        } else {
            (None, None)
        };
        let (done_tx, done_rx) = tokio::sync::oneshot::channel();
        let handle = CallHandle {
            events: rx,
            done: Some(done_rx),
            outcome: None,
            call_id: req.call_id.clone(),
            tool: req.tool.clone(),
            _cancel: cancel.clone().drop_guard(),
        };
        let this = self.clone();
        tokio::spawn(async move {
            let outcome = this.call(req, tx, cancel).await;
            let _ = done_tx.send(outcome);
        });
        handle
    }

    /// Decides a pending approval. Modified arguments must pass the tool's input schema
    /// (else the approval stays pending and the approver is told why); the call checks
    /// them again, and asks anew if they need a stronger approval.
    pub fn decide(
        &self,
        tenant: &Tenant,
        approval_id: &str,
        approve: bool,
        arguments_json: &str,
        message: &str,
    ) -> Result<ApprovalInfo, DecideFailure> {
        let decision = if approve {
            let arguments = if arguments_json.trim().is_empty() {
                None
            } else {
                let info = self
                    .approvals
                    .get(approval_id, &tenant.name)
                    .ok_or_else(|| DecideError::NotFound(approval_id.to_string()))?;
                let args = parse_arguments(arguments_json)
                    .map_err(|e| DecideFailure::InvalidArguments(e.message))?;
                if let Some(entry) = self.registry.load().get(&info.tool) {
                    validate(&entry.validator, &args)
                        .map_err(|e| DecideFailure::InvalidArguments(e.message))?;
                }
                Some(args)
            };
            Decision::Approve {
                arguments,
                message: message.to_string(),
            }
        } else {
            Decision::Deny {
                message: message.to_string(),
            }
        };
        Ok(self.approvals.decide(approval_id, &tenant.name, decision)?)
    }

    /// Gives sandboxed tools `start_allowance` more before the executor gives up on
    /// them: the backend's time to start a run (e.g. a pod) before the program's own
    /// timeout begins.
    pub fn with_start_allowance(mut self, start_allowance: Duration) -> Self {
        self.sandbox_grace = SANDBOX_GRACE + start_allowance;
        self
    }

    /// The current registry (a snapshot: a reload swaps in a new one).
    pub fn registry(&self) -> Arc<Registry> {
        self.registry.load_full()
    }

    /// Replaces the registry (custom tools changed); calls in flight finish on the entries
    /// they looked up.
    pub fn set_registry(&self, registry: Arc<Registry>) {
        self.registry.store(registry);
    }

    /// The metrics.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Runs one call to completion. Never panics, never returns an RPC error.
    pub async fn call(
        &self,
        req: CallRequest,
        stream: Option<mpsc::Sender<StreamChunk>>,
        cancel: CancellationToken,
    ) -> CallOutcome {
        let start = Instant::now();
        let call_id = if req.call_id.is_empty() {
            uuid::Uuid::new_v4().to_string()
        } else {
            req.call_id.clone()
        };
        let call_id = call_id.as_str();
        let args_hash = blake3_hex(req.arguments_json.as_bytes());
        let tenant = req.tenant();
        let entry = self.registry.load().get(&req.tool).cloned();
        let determinism = entry.as_ref().map(|e| e.tool.metadata().determinism);
        let (tool, result) = match entry {
            None => (req.tool.clone(), Err(self.unknown_tool(&req.tool, &tenant))),
            Some(entry) if !tenant.may_use(entry.id()) => (
                entry.id().to_string(),
                Err(ToolError::new(
                    ErrorCode::Forbidden,
                    format!(
                        "tenant {:?} may not use tool {:?} (auth.tenants.*.tools)",
                        tenant.display_name(),
                        entry.id()
                    ),
                )),
            ),
            Some(entry) => {
                let result = self
                    .run_entry(&entry, &req, &tenant, call_id, start, stream, cancel)
                    .await;
                (entry.id().to_string(), result)
            }
        };
        let (output_json, output_hash, error) = match result {
            Ok(value) => {
                let (text, hash) = canonical_with_hash(&value);
                (Some(text), hash, None)
            }
            Err(mut e) => match e.output.take() {
                Some(out) => {
                    let (text, hash) = canonical_with_hash(&out);
                    (Some(text), hash, Some(e))
                }
                None => (None, String::new(), Some(e)),
            },
        };
        let duration = start.elapsed();
        let code = error.as_ref().map_or("OK", |e| e.code.as_str());
        tracing::info!(
            target: "toolrun::audit",
            tenant = %tenant.display_name(),
            tool = %tool,
            call_id = %call_id,
            session_id = %req.session_id,
            args_hash = %args_hash,
            output_hash = %output_hash,
            verdict = code,
            duration_us = duration.as_micros() as u64,
            "tool call"
        );
        if let Some(sink) = &self.audit {
            sink.write(&self.audit_record(
                &req,
                &tenant,
                &tool,
                call_id,
                determinism,
                (&args_hash, &output_hash),
                code,
                duration,
            ));
        }
        self.metrics
            .calls
            .get_or_create(&CallLabels {
                tool: tool.clone(),
                code: code.to_string(),
            })
            .inc();
        self.metrics
            .latency
            .get_or_create(&ToolLabels { tool: tool.clone() })
            .observe(duration.as_secs_f64());
        CallOutcome {
            call_id: call_id.to_string(),
            tool,
            output_json,
            output_hash,
            error,
            duration,
        }
    }

    /// The audit file's record of a call; its arguments only where replay can use them.
    #[allow(clippy::too_many_arguments)]
    fn audit_record(
        &self,
        req: &CallRequest,
        tenant: &Tenant,
        tool: &str,
        call_id: &str,
        determinism: Option<Determinism>,
        (args_hash, output_hash): (&str, &str),
        verdict: &str,
        duration: Duration,
    ) -> AuditRecord {
        let replayable = matches!(
            determinism,
            Some(Determinism::Deterministic | Determinism::Bounded)
        ) && req.session_id.is_empty();
        let max = self
            .audit
            .as_ref()
            .map_or(0, |s| s.max_argument_bytes as usize);
        let arguments = (replayable && req.arguments_json.len() <= max)
            .then(|| parse_arguments(&req.arguments_json).ok())
            .flatten();
        AuditRecord {
            ts_ms: crate::session::SessionManager::unix_ms(std::time::SystemTime::now()),
            tenant: tenant.display_name().to_string(),
            tool: tool.to_string(),
            call_id: call_id.to_string(),
            session_id: req.session_id.clone(),
            determinism: match determinism {
                Some(Determinism::Deterministic) => "deterministic",
                Some(Determinism::Bounded) => "bounded",
                Some(Determinism::NonDeterministic) => "non_deterministic",
                None => "unknown",
            }
            .to_string(),
            args_hash: args_hash.to_string(),
            output_hash: output_hash.to_string(),
            verdict: verdict.to_string(),
            duration_us: duration.as_micros() as u64,
            arguments,
        }
    }

    fn unknown_tool(&self, name: &str, tenant: &Tenant) -> ToolError {
        let registry = self.registry.load();
        let known: Vec<&str> = registry
            .enabled()
            .map(|e| e.id())
            .filter(|id| tenant.may_use(id))
            .collect();
        ToolError::new(
            ErrorCode::UnknownTool,
            format!("unknown tool {name:?}; available: {}", known.join(", ")),
        )
        .with_details(json!({ "available": known }))
    }

    #[allow(clippy::too_many_arguments)]
    async fn run_entry(
        &self,
        entry: &Arc<Entry>,
        req: &CallRequest,
        tenant: &Tenant,
        call_id: &str,
        start: Instant,
        stream: Option<mpsc::Sender<StreamChunk>>,
        cancel: CancellationToken,
    ) -> Result<Value, ToolError> {
        let meta = entry.tool.metadata();
        if !entry.enabled {
            return Err(ToolError::new(
                ErrorCode::ToolDisabled,
                format!(
                    "tool {:?} is {}",
                    meta.id,
                    entry
                        .disabled_reason
                        .as_deref()
                        .unwrap_or("disabled by configuration")
                ),
            ));
        }
        // Seed 003: the capability check, then the resource check, before anything runs
        // (both refusals are audited as every outcome is, by `call`).
        if let Some(cap) = tenant.missing_capability(meta.required_capabilities) {
            return Err(ToolError::new(
                ErrorCode::PermissionDenied,
                format!(
                    "tool {:?} requires capability {cap:?}, which tenant {:?} does not hold",
                    meta.id,
                    tenant.display_name()
                ),
            )
            .with_details(json!({ "capability": cap, "tenant": tenant.display_name() })));
        }
        tenant.admit_call().map_err(limit_error)?;
        let mut args = parse_arguments(&req.arguments_json)?;
        validate(&entry.validator, &args)?;

        // The session: an unknown id is a typed result, never a silent creation. Closing
        // the session cancels the call.
        let session = match req.session_id.as_str() {
            "" => None,
            id => Some(self.session(id, &tenant.name)?),
        };
        let _in_session = session.as_ref().map(|s| s.begin_call());
        let cancel = match &session {
            None => cancel,
            Some(s) => {
                let linked = CancellationToken::new();
                let (a, b, c) = (cancel, s.cancel.clone(), linked.clone());
                tokio::spawn(async move {
                    tokio::select! {
                        _ = a.cancelled() => {}
                        _ = b.cancelled() => {}
                        _ = c.cancelled() => {}
                    }
                    c.cancel();
                });
                linked
            }
        };
        let _unlink = cancel.clone().drop_guard();
        // The caller's own bound (its deadline or timeout_ms), which approvals wait within.
        let caller_deadline =
            (req.timeout_ms > 0).then(|| start + Duration::from_millis(u64::from(req.timeout_ms)));
        let mut ctx = CallContext {
            call_id: call_id.to_string(),
            session_id: req.session_id.clone(),
            deadline: start + entry.timeout,
            cancel: cancel.clone(),
            stream,
            session: session.clone(),
            tenant: tenant.name.clone(),
        };
        let approved = match &session {
            Some(s) => {
                let (final_args, note) = self
                    .approval_gate(entry, s.approval_mode, args, &ctx, caller_deadline)
                    .await?;
                args = final_args;
                note
            }
            None => None,
        };

        // The tool's timeout starts once it may run (after any approval).
        let run_start = Instant::now();
        let mut timeout = entry.timeout;
        if let Some(d) = caller_deadline {
            timeout = timeout.min(d.saturating_duration_since(run_start));
            if timeout.is_zero() {
                return Err(ToolError::new(
                    ErrorCode::Timeout,
                    "the caller's deadline passed while the call waited for approval",
                ));
            }
        }
        ctx.deadline = run_start + timeout;
        let start = run_start;
        let backstop = if meta.sandbox_required {
            timeout + self.sandbox_grace
        } else {
            timeout
        };
        // The tenant's own bound on sandboxed runs, held while the tool runs (at its default
        // share, waited for within the call's timeout).
        let _run_slot = if meta.sandbox_required {
            tokio::select! {
                r = tokio::time::timeout_at(start + timeout, tenant.begin_run()) => match r {
                    Ok(slot) => slot.map_err(limit_error)?,
                    Err(_) => {
                        return Err(ToolError::new(
                            ErrorCode::Timeout,
                            format!(
                                "tool {:?} timed out after {} ms waiting for one of its \
                                 tenant's runs in flight",
                                meta.id,
                                timeout.as_millis()
                            ),
                        ));
                    }
                },
                _ = cancel.cancelled() => {
                    return Err(ToolError::new(ErrorCode::Cancelled, "the call was cancelled"));
                }
            }
        } else {
            None
        };
        let fut = AssertUnwindSafe(entry.tool.call(args, &ctx)).catch_unwind();
        let result = tokio::select! {
            r = tokio::time::timeout_at(start + backstop, fut) => r,
            _ = cancel.cancelled() => {
                return Err(ToolError::new(ErrorCode::Cancelled, "the call was cancelled"));
            }
        };
        let value = match result {
            Err(_) => {
                return Err(ToolError::new(
                    ErrorCode::Timeout,
                    format!(
                        "tool {:?} timed out after {} ms",
                        meta.id,
                        timeout.as_millis()
                    ),
                ));
            }
            Ok(Err(panic)) => {
                let msg = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "unknown panic".into());
                tracing::error!(tool = %meta.id, call_id, "tool panicked: {msg}");
                return Err(ToolError::new(
                    ErrorCode::Internal,
                    format!("tool {:?} failed internally: {msg}", meta.id),
                ));
            }
            Ok(Ok(r)) => r?,
        };
        if let Some(err) = entry.output_validator.iter_errors(&value).next() {
            tracing::error!(tool = %meta.id, call_id, "output breaks its schema: {err}");
            return Err(ToolError::new(
                ErrorCode::Internal,
                format!(
                    "tool {:?} produced output that breaks its schema: {err}",
                    meta.id
                ),
            ));
        }
        let mut value = value;
        // The model learns that its arguments were changed, and to what.
        if let (Some(note), Value::Object(map)) = (approved, &mut value) {
            map.insert("approval".into(), note);
        }
        Ok(value)
    }

    fn session(&self, id: &str, tenant: &str) -> Result<Arc<crate::session::Session>, ToolError> {
        let Some(mgr) = &self.sessions else {
            return Err(ToolError::new(
                ErrorCode::SessionNotFound,
                format!("no session {id:?}: this gateway serves no sessions"),
            ));
        };
        mgr.get(id, tenant).map_err(|e| match e {
            SessionError::NotFound(_) => ToolError::new(ErrorCode::SessionNotFound, e.to_string()),
            other => ToolError::new(ErrorCode::Internal, other.to_string()),
        })
    }

    /// Asks for approval when the session's mode and the tool's policy say so, and waits
    /// for the decision (within the approval timeout and the caller's deadline). Returns
    /// the arguments to run with and, when the approver changed them or left a message,
    /// a note for the result.
    async fn approval_gate(
        &self,
        entry: &Arc<Entry>,
        mode: ApprovalMode,
        mut args: Value,
        ctx: &CallContext,
        caller_deadline: Option<Instant>,
    ) -> Result<(Value, Option<Value>), ToolError> {
        let meta = entry.tool.metadata();
        let mut approved_kind = None;
        // What the result tells the model: the approval's id, the approver's message, and
        // the arguments when the approver changed them (only worth telling with one of those).
        let mut note = serde_json::Map::new();
        let told = |note: serde_json::Map<String, Value>| {
            (note.contains_key("message") || note.contains_key("arguments"))
                .then_some(Value::Object(note))
        };
        for _ in 0..MAX_APPROVAL_ROUNDS {
            let ask = match mode {
                ApprovalMode::All => None,
                ApprovalMode::Safe => entry.tool.approval(&args, ctx).await?,
                ApprovalMode::None => Some(
                    entry
                        .tool
                        .approval(&args, ctx)
                        .await?
                        .unwrap_or_else(|| plain_ask(meta, &args)),
                ),
            };
            let Some(ask) = ask else {
                return Ok((args, told(note)));
            };
            // Arguments the approver wrote need no fresh approval unless they ask for more.
            if approved_kind.is_some_and(|k| ask.kind <= k) {
                return Ok((args, told(note)));
            }
            let kind = ask.kind;
            let timeout = Duration::from_secs(
                self.sessions
                    .as_ref()
                    .map_or(300, |m| m.config().approval_timeout_seconds),
            );
            let mut deadline = Instant::now() + timeout;
            if let Some(d) = caller_deadline {
                deadline = deadline.min(d);
            }
            let waiter = self.approvals.ask(
                &ctx.tenant,
                &ctx.session_id,
                &ctx.call_id,
                &meta.id,
                &args,
                ask,
                deadline.saturating_duration_since(Instant::now()),
            );
            if let Some(tx) = &ctx.stream {
                let _ = tx
                    .send(StreamChunk::Approval(Box::new(waiter.info().clone())))
                    .await;
            }
            let approval_id = waiter.info().approval_id.clone();
            match waiter.wait(deadline, &ctx.cancel).await {
                WaitOutcome::Decided(Decision::Deny { message }) => {
                    return Err(ToolError::new(
                        ErrorCode::ApprovalDenied,
                        if message.is_empty() {
                            "the approver denied this call".to_string()
                        } else {
                            format!("the approver denied this call: {message}")
                        },
                    )
                    .with_details(json!({ "approval_id": approval_id, "message": message })));
                }
                WaitOutcome::Decided(Decision::Approve { arguments, message }) => {
                    approved_kind = Some(kind);
                    note.insert("approvalId".into(), json!(approval_id));
                    if !message.is_empty() {
                        note.insert("message".into(), json!(message));
                    }
                    if let Some(new) = arguments.filter(|new| *new != args) {
                        validate(&entry.validator, &new)?;
                        note.insert("argumentsModified".into(), json!(true));
                        note.insert("arguments".into(), new.clone());
                        args = new;
                        // The changed call may need a stronger approval: ask again.
                        continue;
                    }
                    return Ok((args, told(note)));
                }
                WaitOutcome::TimedOut => {
                    return Err(ToolError::new(
                        ErrorCode::ApprovalRequired,
                        format!(
                            "{} needs approval and none was given in time (approval {approval_id}); \
                             ask the user to approve it (toolrun approvals) and call again",
                            meta.id
                        ),
                    )
                    .with_details(json!({ "approval_id": approval_id })));
                }
                WaitOutcome::Cancelled => {
                    return Err(ToolError::new(
                        ErrorCode::Cancelled,
                        if ctx.session.as_ref().is_some_and(|s| s.is_closed()) {
                            "the session was closed while the call waited for approval"
                        } else {
                            "the call was cancelled while it waited for approval"
                        },
                    ));
                }
            }
        }
        Err(ToolError::new(
            ErrorCode::ApprovalRequired,
            format!(
                "{} was modified more than {MAX_APPROVAL_ROUNDS} times during approval",
                meta.id
            ),
        ))
    }
}

/// A tenant's limit as a result: RESOURCE_EXHAUSTED with when to retry (the front doors
/// turn a lone call's into their transport's overload answer).
fn limit_error(e: LimitError) -> ToolError {
    let retry_after_ms = e.retry_after().as_millis() as u64;
    ToolError::new(ErrorCode::ResourceExhausted, e.to_string())
        .with_details(json!({ "retry_after_ms": retry_after_ms }))
}

/// Parses the arguments: JSON text holding an object (empty text means `{}`).
pub fn parse_arguments(text: &str) -> Result<Value, ToolError> {
    if text.trim().is_empty() {
        return Ok(Value::Object(Default::default()));
    }
    let value: Value = serde_json::from_str(text)
        .map_err(|e| ToolError::invalid_arguments(format!("arguments are not valid JSON: {e}")))?;
    if !value.is_object() {
        return Err(ToolError::invalid_arguments(format!(
            "arguments must be a JSON object, got {}",
            json_type(&value)
        )));
    }
    Ok(value)
}

/// Validates `args` against a compiled schema; the error names each JSON path and rule broken.
pub fn validate(validator: &jsonschema::Validator, args: &Value) -> Result<(), ToolError> {
    let errors: Vec<Value> = validator
        .iter_errors(args)
        .take(MAX_REPORTED_ERRORS)
        .map(|e| {
            let path = e.instance_path().to_string();
            json!({
                "path": if path.is_empty() { "/".to_string() } else { path },
                "rule": e.schema_path().to_string(),
                "message": e.to_string(),
            })
        })
        .collect();
    if errors.is_empty() {
        return Ok(());
    }
    let summary: Vec<String> = errors
        .iter()
        .map(|e| {
            format!(
                "{}: {}",
                e["path"].as_str().unwrap_or("/"),
                e["message"].as_str().unwrap_or("")
            )
        })
        .collect();
    Err(ToolError::invalid_arguments(format!(
        "arguments do not match the tool's input schema: {}",
        summary.join("; ")
    ))
    .with_details(json!({ "errors": errors })))
}

fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

#[cfg(test)]
mod handle_tests {
    use super::*;

    fn handle() -> (
        CallHandle,
        mpsc::Sender<StreamChunk>,
        tokio::sync::oneshot::Sender<CallOutcome>,
    ) {
        let (tx, rx) = mpsc::channel(4);
        let (done_tx, done_rx) = tokio::sync::oneshot::channel();
        let handle = CallHandle {
            events: Some(rx),
            done: Some(done_rx),
            outcome: None,
            call_id: "c".into(),
            tool: "shell".into(),
            _cancel: CancellationToken::new().drop_guard(),
        };
        (handle, tx, done_tx)
    }

    fn outcome() -> CallOutcome {
        CallOutcome {
            call_id: "c".into(),
            tool: "shell".into(),
            output_json: None,
            output_hash: String::new(),
            error: Some(ToolError::new(ErrorCode::Cancelled, "closed")),
            duration: Duration::ZERO,
        }
    }

    /// A sender that outlives the call (a task still holding it) must not lose the result:
    /// the outcome arrives while the chunk channel is open, and is returned after the
    /// chunks sent before it. (It used to be dropped, and the next poll of the spent
    /// receiver panicked: the stream ended without a result.)
    #[tokio::test]
    async fn the_outcome_comes_after_earlier_chunks_while_a_sender_lives_on() {
        let (mut h, tx, done_tx) = handle();
        let waiting = tokio::spawn(async move {
            let first = h.next().await;
            (h, first)
        });
        tokio::task::yield_now().await;
        done_tx.send(outcome()).unwrap();
        let (mut h, first) = waiting.await.unwrap();
        assert!(
            matches!(first, Some(CallEvent::Done(o)) if o.error.as_ref().is_some_and(|e| e.code == ErrorCode::Cancelled))
        );
        assert!(h.next().await.is_none());

        let (mut h, tx2, done_tx) = handle();
        tx2.send(StreamChunk::Stdout("a".into())).await.unwrap();
        done_tx.send(outcome()).unwrap();
        assert!(
            matches!(h.next().await, Some(CallEvent::Chunk(StreamChunk::Stdout(s))) if s == "a")
        );
        assert!(matches!(h.next().await, Some(CallEvent::Done(_))));
        assert!(h.next().await.is_none());
        drop((tx, tx2));
    }

    /// A call task gone without sending its outcome still ends the stream with a result.
    #[tokio::test]
    async fn a_task_gone_without_an_outcome_ends_with_an_internal_error() {
        let (mut h, tx, done_tx) = handle();
        drop((tx, done_tx));
        match h.next().await {
            Some(CallEvent::Done(o)) => assert_eq!(o.error.unwrap().code, ErrorCode::Internal),
            other => panic!("{other:?}"),
        }
        assert!(h.next().await.is_none());
    }
}
