//! `toolrun.v1.ToolService` over the executor.
//!
//! Tool failures are results (`ok = false` with a typed code); RPC statuses are for the
//! transport only: `resource_exhausted` (oversize batch), `unavailable` (shutting down).

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::Stream;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};
use toolrun_proto::v1 as pb;

use crate::error::ErrorCode;
use crate::exec::{CallOutcome, CallRequest, Executor};
use crate::registry::{Format, render};
use crate::tool::{Category, Determinism, SideEffect, StreamChunk};

/// Most calls in one `CallTools` request.
pub const MAX_BATCH: usize = 256;

/// Buffered live-output chunks per streaming call; a slow reader loses chunks (the final
/// result still carries the captured output) rather than stalling the sandbox.
const STREAM_BUFFER: usize = 256;

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
        })
    }

    /// Runs one call on its own task. If the RPC is dropped (client gone, deadline), the
    /// guard cancels the call, which kills its sandbox.
    async fn run(
        &self,
        req: CallRequest,
        stream: Option<mpsc::Sender<StreamChunk>>,
    ) -> CallOutcome {
        let cancel = self.hard_stop.child_token();
        let _guard = cancel.clone().drop_guard();
        let executor = self.executor.clone();
        let tool = req.tool.clone();
        let call_id = req.call_id.clone();
        let task = tokio::spawn(async move { executor.call(req, stream, cancel).await });
        match task.await {
            Ok(outcome) => outcome,
            // The executor catches tool panics; this is a bug in toolrun itself.
            Err(e) => CallOutcome {
                call_id,
                tool,
                output_json: None,
                output_hash: String::new(),
                error: Some(crate::error::ToolError::new(
                    ErrorCode::Internal,
                    format!("call task failed: {e}"),
                )),
                duration: Duration::ZERO,
            },
        }
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
        id: m.id.into(),
        name: m.name.into(),
        description: m.description.into(),
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
    }
}

type EventStream = Pin<Box<dyn Stream<Item = Result<pb::ToolEvent, Status>> + Send>>;

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
            Err(_) => return Err(Status::invalid_argument("unknown ToolFormat value")),
        };
        let tools = self
            .executor
            .registry()
            .enabled()
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
        let call = Self::call_request(deadline, request.into_inner())?;
        let outcome = self.run(call, None).await;
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
        let calls: Vec<CallRequest> = request
            .into_inner()
            .calls
            .into_iter()
            .map(|c| Self::call_request(deadline, c))
            .collect::<Result<_, _>>()?;
        let results = futures::future::join_all(calls.into_iter().map(|c| self.run(c, None))).await;
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
        let call = Self::call_request(deadline, request.into_inner())?;
        let (chunk_tx, mut chunk_rx) = mpsc::channel::<StreamChunk>(STREAM_BUFFER);
        let (event_tx, event_rx) = mpsc::channel::<Result<pb::ToolEvent, Status>>(16);
        let this = self.clone();
        tokio::spawn(async move {
            let run = this.run(call, Some(chunk_tx));
            tokio::pin!(run);
            let outcome = loop {
                tokio::select! {
                    outcome = &mut run => break outcome,
                    Some(chunk) = chunk_rx.recv() => {
                        if event_tx.send(Ok(chunk_event(chunk))).await.is_err() {
                            // The client is gone: dropping `run` cancels the call.
                            return;
                        }
                    }
                }
            };
            // Chunks sent just before the run ended.
            while let Ok(chunk) = chunk_rx.try_recv() {
                if event_tx.send(Ok(chunk_event(chunk))).await.is_err() {
                    return;
                }
            }
            let result = pb::ToolEvent {
                event: Some(pb::tool_event::Event::Result(to_proto(outcome))),
            };
            let _ = event_tx.send(Ok(result)).await;
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(event_rx))))
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
    };
    pb::ToolEvent { event: Some(event) }
}
