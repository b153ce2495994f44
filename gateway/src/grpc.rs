//! `toolrun.v1.ToolService`: a thin adapter over the executor ([`Executor::start`] runs,
//! streams and cancels every call), the session manager and the approvals table.
//!
//! Tool failures are results (`ok = false` with a typed code); RPC statuses are for the
//! transport: `resource_exhausted` (oversize batch, too many sessions), `deadline_exceeded`
//! (a zero deadline); and for the session and approval RPCs, which are not tool calls:
//! `not_found`, `already_exists`, `invalid_argument`, `failed_precondition` (no sessions).
//!
//! Every request arrives authenticated (the auth layer, [`crate::auth`]) with its tenant in
//! the extensions; handlers pass it on to the executor, the sessions and the approvals,
//! which enforce what it may do. A lone call refused for the tenant's limits (CallTool,
//! StreamTool) is `resource_exhausted` with a `retry-after` (seconds) in the metadata;
//! inside a batch it is that call's result (RESOURCE_EXHAUSTED, `retry_after_ms` in details).

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::Stream;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};
use toolrun_proto::v1 as pb;

use crate::approval::{ApprovalInfo, ApprovalKind};
use crate::auth::{Caller, Tenant};
use crate::config::ApprovalMode;
use crate::error::ErrorCode;
use crate::exec::{CallEvent, CallOutcome, CallRequest, DecideFailure, Executor};
use crate::providers::{Format, Provider, ProviderError, render};
use crate::session::{CreateSession, Session, SessionError, SessionManager, Usage};
use crate::tool::{Category, Determinism, SideEffect, StreamChunk};

/// Most calls in one `CallTools` request.
pub const MAX_BATCH: usize = 256;

/// The ToolService implementation.
#[derive(Clone)]
pub struct ToolService {
    executor: Arc<Executor>,
    /// Fired when the server gives up draining: every call still running is cancelled.
    hard_stop: CancellationToken,
}

impl ToolService {
    /// A service over `executor`; `hard_stop` cancels every in-flight call.
    pub fn new(executor: Arc<Executor>, hard_stop: CancellationToken) -> Self {
        ToolService {
            executor,
            hard_stop,
        }
    }

    /// The tonic server wrapper with message size limits.
    pub fn into_server(
        self,
        max_message_bytes: usize,
    ) -> pb::tool_service_server::ToolServiceServer<Self> {
        pb::tool_service_server::ToolServiceServer::new(self)
            .max_decoding_message_size(max_message_bytes)
            .max_encoding_message_size(max_message_bytes)
    }

    /// The executor's request for `c`; `deadline` is the client's gRPC deadline, which
    /// bounds the call too.
    fn call_request(
        deadline: Option<Duration>,
        c: pb::CallToolRequest,
        tenant: &Arc<Tenant>,
    ) -> Result<CallRequest, Status> {
        let mut timeout_ms = c.timeout_ms;
        if let Some(deadline) = deadline {
            if deadline.is_zero() {
                return Err(Status::deadline_exceeded(
                    "the call's deadline had already expired",
                ));
            }
            let ms = deadline.as_millis().clamp(1, u128::from(u32::MAX)) as u32;
            timeout_ms = if timeout_ms == 0 {
                ms
            } else {
                timeout_ms.min(ms)
            };
        }
        Ok(CallRequest {
            call_id: c.call_id,
            tool: c.tool,
            arguments_json: c.arguments_json,
            timeout_ms,
            session_id: c.session_id,
            tenant: Some(tenant.clone()),
        })
    }

    /// Runs one call to its outcome; dropping this future (client gone, deadline) drops
    /// the handle, which cancels the call and kills its sandbox.
    async fn run(&self, req: CallRequest) -> CallOutcome {
        self.executor
            .start(req, &self.hard_stop, false)
            .outcome()
            .await
    }

    fn sessions(&self) -> Result<&Arc<SessionManager>, Status> {
        self.executor.sessions().ok_or_else(|| {
            Status::failed_precondition(
                "this gateway serves no sessions (started without a state dir)",
            )
        })
    }
}

/// The transport's answer to a lone call refused for its tenant's limits.
fn over_limit(o: &CallOutcome) -> Option<Status> {
    let e = o.error.as_ref()?;
    if e.code != ErrorCode::ResourceExhausted {
        return None;
    }
    let retry_ms = e
        .details
        .as_ref()
        .and_then(|d| d["retry_after_ms"].as_u64())
        .unwrap_or(1000);
    Some(crate::inflight::retry_later(
        e.message.clone(),
        Duration::from_millis(retry_ms),
    ))
}

fn session_status(e: SessionError) -> Status {
    match e {
        SessionError::NotFound(_) => Status::not_found(e.to_string()),
        SessionError::AlreadyExists(_) => Status::already_exists(e.to_string()),
        SessionError::Invalid(_) => Status::invalid_argument(e.to_string()),
        SessionError::TooMany(_) | SessionError::TenantTooMany { .. } => {
            Status::resource_exhausted(e.to_string())
        }
        SessionError::Storage(_) => Status::internal(e.to_string()),
        SessionError::Backend(_) => Status::unavailable(e.to_string()),
    }
}

/// The wire form of a session with its workspace's `usage` ([`Session::usage`]).
pub fn session_proto(s: &Session, usage: Usage) -> pb::Session {
    pb::Session {
        session_id: s.id.clone(),
        approval_mode: mode_proto(s.approval_mode) as i32,
        idle_timeout_seconds: s.idle_timeout.as_secs() as u32,
        created_at_ms: SessionManager::unix_ms(s.created_at),
        last_used_at_ms: SessionManager::unix_ms(s.last_used()),
        expires_at_ms: SessionManager::unix_ms(s.expires_at()),
        workspace_bytes_used: usage.bytes_used,
        workspace_bytes_limit: usage.bytes_limit,
        workspace_files_used: usage.files_used,
        workspace_files_limit: usage.files_limit,
        calls_running: s.calls_running(),
        workspace_path: crate::session::WORKSPACE_IN_SANDBOX.into(),
    }
}

fn mode_proto(m: ApprovalMode) -> pb::ApprovalMode {
    match m {
        ApprovalMode::None => pb::ApprovalMode::None,
        ApprovalMode::Safe => pb::ApprovalMode::Safe,
        ApprovalMode::All => pb::ApprovalMode::All,
    }
}

/// The wire form of an approval.
pub fn approval_proto(a: &ApprovalInfo) -> pb::Approval {
    pb::Approval {
        approval_id: a.approval_id.clone(),
        session_id: a.session_id.clone(),
        call_id: a.call_id.clone(),
        tool: a.tool.clone(),
        arguments_json: a.arguments_json.clone(),
        reason: a.reason.clone(),
        kind: match a.kind {
            ApprovalKind::Read => pb::ApprovalKind::Read,
            ApprovalKind::Write => pb::ApprovalKind::Write,
            ApprovalKind::Execute => pb::ApprovalKind::Execute,
            ApprovalKind::Destructive => pb::ApprovalKind::Destructive,
        } as i32,
        requested_at_ms: SessionManager::unix_ms(a.requested_at),
        expires_at_ms: SessionManager::unix_ms(a.expires_at),
    }
}

fn grpc_timeout<T>(request: &Request<T>) -> Option<Duration> {
    let v = request.metadata().get("grpc-timeout")?.to_str().ok()?;
    let (num, unit) = v.split_at(v.len().checked_sub(1)?);
    let n: u64 = num.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n.saturating_mul(3600)),
        "M" => Duration::from_secs(n.saturating_mul(60)),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

/// Converts an outcome to the wire result.
pub fn to_proto(o: CallOutcome) -> pb::ToolResult {
    pb::ToolResult {
        ok: o.ok(),
        call_id: o.call_id,
        tool: o.tool,
        output_json: o.output_json.unwrap_or_default(),
        error: o.error.map(|e| pb::ToolError {
            code: error_code(e.code) as i32,
            message: e.message,
            details_json: e.details.map(|d| d.to_string()).unwrap_or_default(),
        }),
        output_hash: o.output_hash,
        duration_us: o.duration.as_micros() as u64,
    }
}

/// The wire enum of an error code.
pub fn error_code(c: ErrorCode) -> pb::ErrorCode {
    use pb::ErrorCode as P;
    match c {
        ErrorCode::InvalidArguments => P::InvalidArguments,
        ErrorCode::UnknownTool => P::UnknownTool,
        ErrorCode::ToolDisabled => P::ToolDisabled,
        ErrorCode::Timeout => P::Timeout,
        ErrorCode::ExecutionError => P::ExecutionError,
        ErrorCode::MemoryLimit => P::MemoryLimit,
        ErrorCode::OutputLimit => P::OutputLimit,
        ErrorCode::InvalidPath => P::InvalidPath,
        ErrorCode::FileNotFound => P::FileNotFound,
        ErrorCode::PermissionDenied => P::PermissionDenied,
        ErrorCode::ApprovalRequired => P::ApprovalRequired,
        ErrorCode::Unavailable => P::Unavailable,
        ErrorCode::DivisionByZero => P::DivisionByZero,
        ErrorCode::MathError => P::MathError,
        ErrorCode::Cancelled => P::Cancelled,
        ErrorCode::Internal => P::Internal,
        ErrorCode::SessionNotFound => P::SessionNotFound,
        ErrorCode::ApprovalDenied => P::ApprovalDenied,
        ErrorCode::AlreadyExists => P::AlreadyExists,
        ErrorCode::NotADirectory => P::NotADirectory,
        ErrorCode::IsADirectory => P::IsADirectory,
        ErrorCode::NoMatch => P::NoMatch,
        ErrorCode::AmbiguousMatch => P::AmbiguousMatch,
        ErrorCode::QuotaExceeded => P::QuotaExceeded,
        ErrorCode::Unauthenticated => P::Unauthenticated,
        ErrorCode::Forbidden => P::Forbidden,
        ErrorCode::ResourceExhausted => P::ResourceExhausted,
    }
}

/// The contract name of a wire error code (`TIMEOUT` for `ERROR_CODE_TIMEOUT`).
pub fn error_code_name(code: i32) -> String {
    pb::ErrorCode::try_from(code)
        .map(|c| {
            c.as_str_name()
                .trim_start_matches("ERROR_CODE_")
                .to_string()
        })
        .unwrap_or_else(|_| format!("UNKNOWN({code})"))
}

fn definition(entry: &crate::registry::Entry, format: Option<Format>) -> pb::ToolDefinition {
    let m = entry.tool.metadata();
    pb::ToolDefinition {
        id: m.id.to_string(),
        name: m.name.to_string(),
        description: m.description.to_string(),
        version: m.version.into(),
        category: match m.category {
            Category::Computation => pb::Category::Computation,
            Category::Execution => pb::Category::Execution,
            Category::Search => pb::Category::Search,
            Category::Memory => pb::Category::Memory,
            Category::Utility => pb::Category::Utility,
            Category::Filesystem => pb::Category::Filesystem,
        } as i32,
        input_schema_json: entry.tool.input_schema().to_string(),
        output_schema_json: entry.tool.output_schema().to_string(),
        sandbox_required: m.sandbox_required,
        side_effect: match m.side_effect {
            SideEffect::Pure => pb::SideEffect::Pure,
            SideEffect::Impure => pb::SideEffect::Impure,
        } as i32,
        determinism: match m.determinism {
            Determinism::Deterministic => pb::Determinism::Deterministic,
            Determinism::Bounded => pb::Determinism::Bounded,
            Determinism::NonDeterministic => pb::Determinism::NonDeterministic,
        } as i32,
        approval_policy: match m.approval {
            crate::tool::ApprovalPolicy::Never => pb::ApprovalPolicy::Never,
            crate::tool::ApprovalPolicy::Always => pb::ApprovalPolicy::Always,
            crate::tool::ApprovalPolicy::Conditional => pb::ApprovalPolicy::Conditional,
        } as i32,
        timeout_ms: entry.timeout.as_millis() as u32,
        required_capabilities: m
            .required_capabilities
            .iter()
            .map(|s| s.to_string())
            .collect(),
        aliases: entry.aliases.clone(),
        rendered_json: format
            .map(|f| render(entry, f).to_string())
            .unwrap_or_default(),
        disabled_reason: entry.disabled_reason.clone().unwrap_or_default(),
    }
}

type EventStream = Pin<Box<dyn Stream<Item = Result<pb::ToolEvent, Status>> + Send>>;
type ApprovalStream = Pin<Box<dyn Stream<Item = Result<pb::Approval, Status>> + Send>>;

#[tonic::async_trait]
impl pb::tool_service_server::ToolService for ToolService {
    async fn list_tools(
        &self,
        request: Request<pb::ListToolsRequest>,
    ) -> Result<Response<pb::ListToolsResponse>, Status> {
        let format = match pb::ToolFormat::try_from(request.get_ref().format) {
            Ok(pb::ToolFormat::Unspecified) => None,
            Ok(pb::ToolFormat::Openai) => Some(Format::Openai),
            Ok(pb::ToolFormat::Anthropic) => Some(Format::Anthropic),
            Ok(pb::ToolFormat::Mcp) => Some(Format::Mcp),
            Ok(pb::ToolFormat::OpenaiResponses) => Some(Format::OpenaiResponses),
            Ok(pb::ToolFormat::Ollama) => Some(Format::Ollama),
            Ok(pb::ToolFormat::Gemini) => Some(Format::Gemini),
            Err(_) => return Err(Status::invalid_argument("unknown ToolFormat value")),
        };
        let tenant = Caller::of(request.extensions());
        let all = request.get_ref().include_disabled;
        let tools = self
            .executor
            .registry()
            .all()
            .filter(|e| e.enabled || all)
            .filter(|e| tenant.may_use(e.id()))
            .map(|e| definition(e, format))
            .collect();
        Ok(Response::new(pb::ListToolsResponse { tools }))
    }

    async fn call_tool(
        &self,
        request: Request<pb::CallToolRequest>,
    ) -> Result<Response<pb::CallToolResponse>, Status> {
        // Moved, not cloned: arguments can be megabytes.
        let deadline = grpc_timeout(&request);
        let tenant = Caller::of(request.extensions());
        let call = Self::call_request(deadline, request.into_inner(), &tenant)?;
        let outcome = self.run(call).await;
        if let Some(status) = over_limit(&outcome) {
            return Err(status);
        }
        Ok(Response::new(pb::CallToolResponse {
            result: Some(to_proto(outcome)),
        }))
    }

    async fn call_tools(
        &self,
        request: Request<pb::CallToolsRequest>,
    ) -> Result<Response<pb::CallToolsResponse>, Status> {
        let n = request.get_ref().calls.len();
        if n > MAX_BATCH {
            return Err(Status::resource_exhausted(format!(
                "batch of {n} calls exceeds the limit of {MAX_BATCH}"
            )));
        }
        let deadline = grpc_timeout(&request);
        let tenant = Caller::of(request.extensions());
        let calls: Vec<CallRequest> = request
            .into_inner()
            .calls
            .into_iter()
            .map(|c| Self::call_request(deadline, c, &tenant))
            .collect::<Result<_, _>>()?;
        let results = futures::future::join_all(calls.into_iter().map(|c| self.run(c))).await;
        Ok(Response::new(pb::CallToolsResponse {
            results: results.into_iter().map(to_proto).collect(),
        }))
    }

    type StreamToolStream = EventStream;

    async fn stream_tool(
        &self,
        request: Request<pb::CallToolRequest>,
    ) -> Result<Response<Self::StreamToolStream>, Status> {
        let deadline = grpc_timeout(&request);
        let tenant = Caller::of(request.extensions());
        let call = Self::call_request(deadline, request.into_inner(), &tenant)?;
        let (event_tx, event_rx) = mpsc::channel::<Result<pb::ToolEvent, Status>>(16);
        let mut handle = self.executor.start(call, &self.hard_stop, true);
        // The deadline bounds the whole stream, not only the handler (which returns at once):
        // when it passes, the stream ends DEADLINE_EXCEEDED and the call is cancelled.
        let expires = deadline.map(|d| tokio::time::Instant::now() + d);
        tokio::spawn(async move {
            loop {
                let next = match expires {
                    Some(at) => match tokio::time::timeout_at(at, handle.next()).await {
                        Ok(next) => next,
                        Err(_) => {
                            // Dropping the handle (on return) cancels the call.
                            let _ = event_tx
                                .send(Err(Status::deadline_exceeded(
                                    "the call's deadline expired; the call was cancelled",
                                )))
                                .await;
                            return;
                        }
                    },
                    None => handle.next().await,
                };
                let Some(event) = next else { return };
                let event = match event {
                    CallEvent::Chunk(chunk) => chunk_event(chunk),
                    CallEvent::Done(outcome) => {
                        if let Some(status) = over_limit(&outcome) {
                            let _ = event_tx.send(Err(status)).await;
                            return;
                        }
                        pb::ToolEvent {
                            event: Some(pb::tool_event::Event::Result(to_proto(outcome))),
                        }
                    }
                };
                if event_tx.send(Ok(event)).await.is_err() {
                    // The client is gone: dropping the handle cancels the call.
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(event_rx))))
    }

    async fn create_session(
        &self,
        request: Request<pb::CreateSessionRequest>,
    ) -> Result<Response<pb::Session>, Status> {
        let tenant = Caller::of(request.extensions());
        let r = request.into_inner();
        let approval_mode = match pb::ApprovalMode::try_from(r.approval_mode) {
            Ok(pb::ApprovalMode::Unspecified) => None,
            Ok(pb::ApprovalMode::None) => Some(ApprovalMode::None),
            Ok(pb::ApprovalMode::Safe) => Some(ApprovalMode::Safe),
            Ok(pb::ApprovalMode::All) => Some(ApprovalMode::All),
            Err(_) => {
                return Err(Status::invalid_argument(format!(
                    "unknown approval_mode {}; use NONE, SAFE or ALL",
                    r.approval_mode
                )));
            }
        };
        let mgr = self.sessions()?.clone();
        let req = CreateSession {
            session_id: r.session_id,
            approval_mode: approval_mode.or(tenant.approval_mode),
            tenant: tenant.name.clone(),
            tenant_max_sessions: tenant.max_sessions,
            workspace_size_mb: tenant.workspace_size_mb,
            idle_timeout: (r.idle_timeout_seconds > 0)
                .then(|| Duration::from_secs(u64::from(r.idle_timeout_seconds))),
        };
        // Locally mkfs and mount run off the runtime's threads; on kubernetes this waits
        // for the ToolSession's pod.
        let session = mgr.create_session(req).await.map_err(session_status)?;
        Ok(Response::new(session_proto(
            &session,
            session.usage().await,
        )))
    }

    async fn get_session(
        &self,
        request: Request<pb::GetSessionRequest>,
    ) -> Result<Response<pb::Session>, Status> {
        let tenant = Caller::of(request.extensions());
        let s = self
            .sessions()?
            .get(&request.get_ref().session_id, &tenant.name)
            .map_err(session_status)?;
        Ok(Response::new(session_proto(&s, s.usage().await)))
    }

    async fn list_sessions(
        &self,
        request: Request<pb::ListSessionsRequest>,
    ) -> Result<Response<pb::ListSessionsResponse>, Status> {
        let tenant = Caller::of(request.extensions());
        let listed = self.sessions()?.list_for(&tenant.name);
        let usages = crate::session::usage_of(&listed).await;
        let sessions = listed
            .iter()
            .zip(usages)
            .map(|(s, u)| session_proto(s, u))
            .collect();
        Ok(Response::new(pb::ListSessionsResponse { sessions }))
    }

    async fn close_session(
        &self,
        request: Request<pb::CloseSessionRequest>,
    ) -> Result<Response<pb::CloseSessionResponse>, Status> {
        let tenant = Caller::of(request.extensions());
        let id = request.into_inner().session_id;
        let (session, cancelled) = self
            .sessions()?
            .close(&id, &tenant.name, "CloseSession")
            .await
            .map_err(session_status)?;
        Ok(Response::new(pb::CloseSessionResponse {
            session: Some(session_proto(&session, session.usage().await)),
            calls_cancelled: cancelled,
        }))
    }

    async fn list_approvals(
        &self,
        request: Request<pb::ListApprovalsRequest>,
    ) -> Result<Response<pb::ListApprovalsResponse>, Status> {
        let tenant = Caller::of(request.extensions());
        let session = &request.get_ref().session_id;
        let approvals = self
            .executor
            .approvals()
            .list(
                (!session.is_empty()).then_some(session.as_str()),
                &tenant.name,
            )
            .iter()
            .map(approval_proto)
            .collect();
        Ok(Response::new(pb::ListApprovalsResponse { approvals }))
    }

    type WatchApprovalsStream = ApprovalStream;

    async fn watch_approvals(
        &self,
        request: Request<pb::WatchApprovalsRequest>,
    ) -> Result<Response<Self::WatchApprovalsStream>, Status> {
        let tenant = Caller::of(request.extensions());
        let session = request.into_inner().session_id;
        let filter = (!session.is_empty()).then_some(session);
        let (pending, mut rx) = self
            .executor
            .approvals()
            .watch(filter.as_deref(), &tenant.name);
        let (tx, out) = mpsc::channel::<Result<pb::Approval, Status>>(64);
        let stop = self.hard_stop.clone();
        tokio::spawn(async move {
            let mut sent = std::collections::HashSet::new();
            for a in pending {
                sent.insert(a.approval_id.clone());
                if tx.send(Ok(approval_proto(&a))).await.is_err() {
                    return;
                }
            }
            loop {
                let a = tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tx.closed() => return,
                    r = rx.next() => match r {
                        Ok(a) => a,
                        Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                            tracing::warn!(missed = n, "approval watcher too slow");
                            continue;
                        }
                        Err(_) => return,
                    },
                };
                // Asked between subscribing and listing: already sent.
                if sent.remove(&a.approval_id) {
                    continue;
                }
                if tx.send(Ok(approval_proto(&a))).await.is_err() {
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(out))))
    }

    async fn decide_approval(
        &self,
        request: Request<pb::DecideApprovalRequest>,
    ) -> Result<Response<pb::DecideApprovalResponse>, Status> {
        let tenant = Caller::of(request.extensions());
        let r = request.into_inner();
        if !r.approve && !r.arguments_json.trim().is_empty() {
            return Err(Status::invalid_argument(
                "arguments_json goes with approve = true only",
            ));
        }
        let info = self
            .executor
            .decide(
                &tenant,
                &r.approval_id,
                r.approve,
                &r.arguments_json,
                &r.message,
            )
            .map_err(|e| match e {
                DecideFailure::NotFound(e) => Status::not_found(e.to_string()),
                DecideFailure::InvalidArguments(m) => Status::invalid_argument(format!(
                    "modified arguments rejected (the approval is still pending): {m}"
                )),
            })?;
        Ok(Response::new(pb::DecideApprovalResponse {
            approval: Some(approval_proto(&info)),
            approved: r.approve,
        }))
    }

    async fn call_provider_tools(
        &self,
        request: Request<pb::CallProviderToolsRequest>,
    ) -> Result<Response<pb::CallProviderToolsResponse>, Status> {
        let deadline = grpc_timeout(&request);
        let tenant = Caller::of(request.extensions());
        let r = request.into_inner();
        let provider = Provider::from_name(&r.provider).map_err(provider_status)?;
        let (message, calls) =
            crate::providers::parse_message(provider, &r.message_json).map_err(provider_status)?;
        // Each call as CallTool would take it (the client's deadline bounds every call).
        let requests = crate::providers::requests(&calls, &r.session_id, 0, &tenant)
            .into_iter()
            .map(|c| {
                Self::call_request(
                    deadline,
                    pb::CallToolRequest {
                        call_id: c.call_id,
                        tool: c.tool,
                        arguments_json: c.arguments_json,
                        timeout_ms: c.timeout_ms,
                        session_id: c.session_id,
                    },
                    &tenant,
                )
            })
            .collect::<Result<Vec<_>, _>>()?;
        let outcomes = crate::providers::execute(&self.executor, &self.hard_stop, requests).await;
        let results_json = provider.render(&message, &calls, &outcomes);
        Ok(Response::new(pb::CallProviderToolsResponse {
            results_json,
            results: outcomes.into_iter().map(to_proto).collect(),
        }))
    }
}

fn provider_status(e: ProviderError) -> Status {
    match e {
        ProviderError::TooManyCalls(_) => Status::resource_exhausted(e.to_string()),
        _ => Status::invalid_argument(e.to_string()),
    }
}

fn chunk_event(chunk: StreamChunk) -> pb::ToolEvent {
    let event = match chunk {
        StreamChunk::Stdout(s) => pb::tool_event::Event::Stdout(pb::OutputChunk {
            data: s.into_bytes(),
        }),
        StreamChunk::Stderr(s) => pb::tool_event::Event::Stderr(pb::OutputChunk {
            data: s.into_bytes(),
        }),
        StreamChunk::Approval(a) => pb::tool_event::Event::Approval(approval_proto(&a)),
    };
    pb::ToolEvent { event: Some(event) }
}
