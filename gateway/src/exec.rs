//! The per-call flow (DESIGN.md "Execution flow"): look up -> capability check -> validate
//! arguments -> execute with timeout -> validate and normalise output -> hash -> audit ->
//! result. Every failure becomes a typed result; nothing here returns an RPC error.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::canonical::{blake3_hex, canonical_with_hash};
use crate::error::{ErrorCode, ToolError};
use crate::metrics::{CallLabels, Metrics, ToolLabels};
use crate::registry::{Entry, Registry};
use crate::tool::{CallContext, StreamChunk};

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
    registry: Arc<Registry>,
    metrics: Arc<Metrics>,
    /// How long past its deadline a sandboxed tool may take to report.
    sandbox_grace: Duration,
}

impl Executor {
    /// An executor over `registry`, recording into `metrics`.
    pub fn new(registry: Arc<Registry>, metrics: Arc<Metrics>) -> Self {
        Executor {
            registry,
            metrics,
            sandbox_grace: SANDBOX_GRACE,
        }
    }

    /// Gives sandboxed tools `start_allowance` more before the executor gives up on
    /// them: the backend's time to start a run (e.g. a pod) before the program's own
    /// timeout begins.
    pub fn with_start_allowance(mut self, start_allowance: Duration) -> Self {
        self.sandbox_grace = SANDBOX_GRACE + start_allowance;
        self
    }

    /// The registry.
    pub fn registry(&self) -> &Arc<Registry> {
        &self.registry
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
        let args_hash = blake3_hex(req.arguments_json.as_bytes());
        let (tool, result) = match self.registry.get(&req.tool) {
            None => (req.tool.clone(), Err(self.unknown_tool(&req.tool))),
            Some(entry) => {
                let entry = entry.clone();
                let result = self
                    .run_entry(&entry, &req, &call_id, start, stream, cancel)
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
            tool = %tool,
            call_id = %call_id,
            session_id = %req.session_id,
            args_hash = %args_hash,
            output_hash = %output_hash,
            verdict = code,
            duration_us = duration.as_micros() as u64,
            "tool call"
        );
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
            call_id,
            tool,
            output_json,
            output_hash,
            error,
            duration,
        }
    }

    fn unknown_tool(&self, name: &str) -> ToolError {
        let known: Vec<&str> = self.registry.enabled().map(|e| e.id()).collect();
        ToolError::new(
            ErrorCode::UnknownTool,
            format!("unknown tool {name:?}; available: {}", known.join(", ")),
        )
        .with_details(json!({ "available": known }))
    }

    async fn run_entry(
        &self,
        entry: &Arc<Entry>,
        req: &CallRequest,
        call_id: &str,
        start: Instant,
        stream: Option<mpsc::Sender<StreamChunk>>,
        cancel: CancellationToken,
    ) -> Result<Value, ToolError> {
        let meta = entry.tool.metadata();
        if !entry.enabled {
            return Err(ToolError::new(
                ErrorCode::ToolDisabled,
                format!("tool {:?} is disabled by configuration", meta.id),
            ));
        }
        // Callers hold no capabilities yet, so a tool that requires any is refused.
        if let Some(cap) = meta.required_capabilities.first() {
            return Err(ToolError::new(
                ErrorCode::PermissionDenied,
                format!("tool {:?} requires capability {cap:?}", meta.id),
            ));
        }
        let args = parse_arguments(&req.arguments_json)?;
        validate(&entry.validator, &args)?;

        let mut timeout = entry.timeout;
        if req.timeout_ms > 0 {
            timeout = timeout.min(Duration::from_millis(u64::from(req.timeout_ms)));
        }
        let ctx = CallContext {
            call_id: call_id.to_string(),
            session_id: req.session_id.clone(),
            deadline: start + timeout,
            cancel: cancel.clone(),
            stream,
        };
        let backstop = if meta.sandbox_required {
            timeout + self.sandbox_grace
        } else {
            timeout
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
                tracing::error!(tool = meta.id, call_id, "tool panicked: {msg}");
                return Err(ToolError::new(
                    ErrorCode::Internal,
                    format!("tool {:?} failed internally: {msg}", meta.id),
                ));
            }
            Ok(Ok(r)) => r?,
        };
        if let Some(err) = entry.output_validator.iter_errors(&value).next() {
            tracing::error!(tool = meta.id, call_id, "output breaks its schema: {err}");
            return Err(ToolError::new(
                ErrorCode::Internal,
                format!(
                    "tool {:?} produced output that breaks its schema: {err}",
                    meta.id
                ),
            ));
        }
        Ok(value)
    }
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
