//! MCP over Streamable HTTP at `/mcp` (the official Rust SDK, `rmcp`): a thin adapter over
//! the registry and the executor, like gRPC.
//!
//! - `tools/list`: every enabled tool, sessions' tools included, with its input schema, an
//!   output schema where the output is an object, and annotations from its metadata
//!   ([`tools`]).
//! - `tools/call`: [`Executor::start`] runs it (validation, limits, approvals, audit,
//!   metrics: rmcp validates nothing). A tool's failure is an `isError: true` result whose
//!   `structuredContent` is `{error: {code, message, details?}, output?}` and whose text is
//!   `CODE: message`; success is `structuredContent` plus the canonical JSON as text. An
//!   unknown tool is JSON-RPC `-32602` (the spec's "unknown tool").
//! - Progress: when the request carries a `progressToken`, live stdout/stderr chunks (and
//!   the approval a call waits for) are `notifications/progress` on the call's stream.
//! - Cancellation: the client closing the call's stream (2026-07-28) or sending
//!   `notifications/cancelled` ([`intake`]) drops the call's handle, which kills its sandbox.
//! - Sessions: a call joins a toolrun session named by `_meta["toolrun.dev/session_id"]`,
//!   the `toolrun-session-id` header, or the `session_id` URL query parameter
//!   (`/mcp?session_id=ID`, for clients that only take a URL); differing values are refused.
//!   Sessions are created and closed over gRPC (`toolrun session create`).
//! - Approvals: a call that needs one waits for `toolrun approve` / `DecideApproval`, as over
//!   gRPC, announcing it in a progress notification. MCP elicitation needs a server-to-client
//!   request on a session, which a stateless server cannot route, so it is not used.
//! - Authentication: the listener's auth layer ([`crate::auth`]) admits a request with a
//!   valid `authorization: Bearer <key>` (401 with `WWW-Authenticate` otherwise) and puts
//!   its tenant in the request's extensions: `tools/list` shows the tenant's allowed tools,
//!   `tools/call` runs as the tenant, and cancellation by notification reaches only the
//!   tenant's own calls.
//! - Protocol versions 2025-06-18, 2025-11-25 (the `initialize` handshake) and 2026-07-28
//!   (`server/discover`, per-request metadata), all stateless: no server-side session state,
//!   so replicas behind one Service answer any request.

pub mod intake;
pub mod tools;

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, Implementation, ListToolsResult,
    PaginatedRequestParams, ProgressNotificationParam, ProgressToken, ProtocolVersion, RequestId,
    ServerCapabilities, ServerConfig, ServerJsonRpcMessage, ServerResult, Tool,
};
use rmcp::service::{Peer, RequestContext};
use rmcp::transport::streamable_http_server::session::never::NeverSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::auth::{Caller, Tenant};
use crate::error::{ErrorCode, ToolError};
use crate::exec::{CallEvent, CallRequest, Executor};
use crate::tool::StreamChunk;
use intake::{InFlight, Intake, SESSION_HEADER};
use tools::meta_keys;

/// The protocol versions served (structured tool output needs 2025-06-18 or later).
pub const PROTOCOL_VERSIONS: &[ProtocolVersion] = &[
    ProtocolVersion::V_2025_06_18,
    ProtocolVersion::V_2025_11_25,
    ProtocolVersion::V_2026_07_28,
];

/// The header naming a call's session.
pub const SESSION_ID_HEADER: &str = "toolrun-session-id";

/// How often an open event stream gets a keep-alive: a client that went away is noticed
/// (and its call cancelled) within about this long even while the call prints nothing.
const SSE_KEEP_ALIVE: Duration = Duration::from_secs(1);

/// The `/mcp` route: rmcp's Streamable HTTP service (stateless, JSON answers where no
/// notification precedes them) behind [`intake::intake`]. The listener's guard
/// ([`crate::http`]) checks Host and Origin, so rmcp's own check is off.
pub fn router(
    executor: Arc<Executor>,
    hard_stop: CancellationToken,
    max_body_bytes: usize,
) -> Router {
    let in_flight = Arc::new(InFlight::default());
    let handler = McpHandler::new(executor, hard_stop.clone(), in_flight.clone());
    let service_handler = handler.clone();
    let config = StreamableHttpServerConfig::default()
        .with_legacy_session_mode(false)
        .with_json_response(true)
        .disable_allowed_hosts()
        .disable_allowed_origins()
        .with_max_request_body_bytes(max_body_bytes)
        .with_sse_keep_alive(Some(SSE_KEEP_ALIVE))
        .with_cancellation_token(hard_stop.child_token());
    let service = StreamableHttpService::new(
        move || Ok(service_handler.clone()),
        Arc::new(NeverSessionManager::default()),
        config,
    );
    Router::new()
        .nest_service("/mcp", service)
        .layer(axum::middleware::from_fn_with_state(
            Arc::new(Intake {
                max_body_bytes,
                in_flight,
                handler: handler.clone(),
            }),
            intake::intake,
        ))
}

/// The MCP server: cheap to clone (rmcp makes one per request).
#[derive(Clone)]
pub struct McpHandler {
    inner: Arc<Inner>,
}

struct Inner {
    executor: Arc<Executor>,
    hard_stop: CancellationToken,
    in_flight: Arc<InFlight>,
    /// Definitions, built from the registry they describe (again when it is swapped).
    listing: std::sync::Mutex<Arc<Listing>>,
    /// What `initialize` and `server/discover` answer (rmcp asks for it on every request).
    info: ServerConfig,
}

impl McpHandler {
    /// A handler over `executor`; `hard_stop` cancels every call.
    pub fn new(
        executor: Arc<Executor>,
        hard_stop: CancellationToken,
        in_flight: Arc<InFlight>,
    ) -> Self {
        let listing = std::sync::Mutex::new(Arc::new(Listing::of(executor.registry())));
        McpHandler {
            inner: Arc::new(Inner {
                executor,
                hard_stop,
                in_flight,
                listing,
                info: server_info(),
            }),
        }
    }

    /// The definitions of the executor's current registry.
    fn listing(&self) -> Arc<Listing> {
        let registry = self.inner.executor.registry();
        let mut cached = self.inner.listing.lock().unwrap_or_else(|e| e.into_inner());
        if !Arc::ptr_eq(&cached.registry, &registry) {
            *cached = Arc::new(Listing::of(registry));
        }
        cached.clone()
    }
}

/// The MCP definitions of one registry.
struct Listing {
    /// The registry described (held, so its address identifies it while cached).
    registry: Arc<crate::registry::Registry>,
    tools: Vec<Tool>,
    /// Definitions by id and alias.
    by_name: HashMap<String, Tool>,
}

impl Listing {
    fn of(registry: Arc<crate::registry::Registry>) -> Self {
        let mut tools = Vec::new();
        let mut by_name = HashMap::new();
        for entry in registry.enabled() {
            let t = tools::tool(entry);
            for alias in &entry.aliases {
                by_name.insert(alias.clone(), t.clone());
            }
            by_name.insert(entry.id().to_string(), t.clone());
            tools.push(t);
        }
        Listing {
            registry,
            tools,
            by_name,
        }
    }
}

/// The request's tenant, put in its extensions by the auth layer ([`crate::auth`]).
fn caller(parts: Option<&http::request::Parts>) -> Arc<Tenant> {
    match parts {
        Some(p) => Caller::of(&p.extensions),
        None => Tenant::nobody(),
    }
}

/// The session a call names, from `_meta`, the header or the URL; differing values are an
/// error.
fn session_id(
    meta: &serde_json::Map<String, Value>,
    parts: Option<&http::request::Parts>,
) -> Result<String, ToolError> {
    let mut found: Vec<(&str, String)> = Vec::new();
    match meta.get(meta_keys::SESSION_ID) {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) => found.push(("_meta", s.clone())),
        Some(other) => {
            return Err(ToolError::invalid_arguments(format!(
                "_meta[\"{}\"] must be a string, got {other}",
                meta_keys::SESSION_ID
            )));
        }
    }
    if let Some(parts) = parts {
        if let Some(v) = parts.headers.get(SESSION_ID_HEADER) {
            let v = v.to_str().map_err(|_| {
                ToolError::invalid_arguments(format!("the {SESSION_ID_HEADER} header is not text"))
            })?;
            found.push(("header", v.trim().to_string()));
        }
        if let Some(q) = parts.uri.query() {
            for pair in q.split('&') {
                if let Some(v) = pair.strip_prefix("session_id=") {
                    found.push(("URL", v.to_string()));
                }
            }
        }
    }
    found.retain(|(_, v)| !v.is_empty());
    match found.as_slice() {
        [] => Ok(String::new()),
        [(_, first), rest @ ..] => {
            if let Some((how, other)) = rest.iter().find(|(_, v)| v != first) {
                return Err(ToolError::invalid_arguments(format!(
                    "two session ids given: {first:?} ({}) and {other:?} ({how}); name one",
                    found[0].0
                )));
            }
            Ok(first.clone())
        }
    }
}

/// The caller's bound from `_meta["toolrun.dev/timeout_ms"]` (0 = the tool's timeout).
fn timeout_ms(meta: &serde_json::Map<String, Value>) -> Result<u32, ToolError> {
    match meta.get(meta_keys::TIMEOUT_MS) {
        None | Some(Value::Null) => Ok(0),
        Some(v) => v
            .as_u64()
            .filter(|n| (1..=u64::from(u32::MAX)).contains(n))
            .map(|n| n as u32)
            .ok_or_else(|| {
                ToolError::invalid_arguments(format!(
                    "_meta[\"{}\"] must be a positive integer (ms), got {v}",
                    meta_keys::TIMEOUT_MS
                ))
            }),
    }
}

fn progress(
    token: &ProgressToken,
    sent: u64,
    stream: &str,
    message: String,
) -> ProgressNotificationParam {
    let mut p = ProgressNotificationParam::new(token.clone(), sent as f64).with_message(message);
    let mut meta = serde_json::Map::new();
    meta.insert(meta_keys::STREAM.into(), json!(stream));
    p.meta = Some(meta.into());
    p
}

fn server_info() -> ServerConfig {
    ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
        .with_server_info(
            Implementation::new("toolrun", env!("CARGO_PKG_VERSION"))
                .with_title("toolrun")
                .with_description(
                    "Validates and runs AI agents' tool calls; untrusted code in a sandbox",
                ),
        )
        .with_instructions(
            "Tools run through toolrun: arguments are validated against each tool's input \
                 schema; a failure is an isError result whose structuredContent.error.code is a \
                 typed code. Session tools (read_file, write_file, shell, ...) need a toolrun \
                 session: pass its id in _meta[\"toolrun.dev/session_id\"], the \
                 toolrun-session-id header, or ?session_id= on the URL.",
        )
}

impl ServerHandler for McpHandler {
    fn get_info(&self) -> ServerConfig {
        self.inner.info.clone()
    }

    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        Cow::Borrowed(PROTOCOL_VERSIONS)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let tenant = caller(context.extensions.get::<http::request::Parts>());
        let mut tools = self.listing().tools.clone();
        tools.retain(|t| tenant.may_use(&t.name));
        Ok(ListToolsResult::with_all_items(tools))
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.listing().by_name.get(name).cloned()
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let live = context
            .meta
            .get_progress_token()
            .map(|token| (token, context.peer.clone()));
        self.call(
            request,
            &context.meta.0.0,
            context.extensions.get::<http::request::Parts>(),
            &context.id,
            live,
            Some(&context.ct),
        )
        .await
    }
}

impl McpHandler {
    /// Answers a `tools/call` that [`intake`] took off rmcp's path
    /// ([`intake::DirectCall`]): the same call and the same JSON-RPC answer rmcp would
    /// write (`application/json`, 200), without rmcp's per-request service.
    pub(crate) async fn answer(
        &self,
        call: intake::DirectCall,
        parts: &http::request::Parts,
    ) -> axum::response::Response {
        use axum::response::IntoResponse;
        let intake::DirectCall { id, mut params, .. } = call;
        let meta = params.meta.take().unwrap_or_default();
        let message = match self
            .call(params, &meta.0.0, Some(parts), &id, None, None)
            .await
        {
            Ok(r) => {
                // As rmcp answers a peer that negotiated a version before 2026-07-28 (every
                // direct call's): without `resultType: "complete"` or non-object output.
                let mut result = ServerResult::from(r);
                result.strip_result_type_for_legacy_peer();
                result.strip_non_object_output_for_legacy_peer();
                ServerJsonRpcMessage::response(result, id)
            }
            Err(e) => ServerJsonRpcMessage::error(e, Some(id)),
        };
        match serde_json::to_vec(&message) {
            Ok(body) => (
                http::StatusCode::OK,
                [(http::header::CONTENT_TYPE, "application/json")],
                body,
            )
                .into_response(),
            Err(e) => (
                http::StatusCode::INTERNAL_SERVER_ERROR,
                format!("cannot serialise the answer: {e}\n"),
            )
                .into_response(),
        }
    }

    /// Runs a `tools/call`: from rmcp ([`ServerHandler::call_tool`]) or answered directly
    /// ([`intake`]). `live` is where live output goes (the request's progress token
    /// and its peer); `ct` cancels the call (else dropping the future does).
    pub(crate) async fn call(
        &self,
        request: CallToolRequestParams,
        meta: &serde_json::Map<String, Value>,
        parts: Option<&http::request::Parts>,
        id: &RequestId,
        live: Option<(ProgressToken, Peer<RoleServer>)>,
        ct: Option<&CancellationToken>,
    ) -> Result<CallToolResponse, McpError> {
        let inner = &self.inner;
        let tenant = caller(parts);
        let (session_id, timeout_ms) = match (session_id(meta, parts), timeout_ms(meta)) {
            (Ok(s), Ok(t)) => (s, t),
            (Err(e), _) | (_, Err(e)) => return Ok(tools::error_result(&e, None).into()),
        };
        let arguments_json = match &request.arguments {
            Some(args) => serde_json::to_string(args).unwrap_or_default(),
            None => String::new(),
        };
        // Clients at the handshake versions cancel by notification ([`intake`]).
        let registration = parts
            .and_then(|p| p.headers.get(SESSION_HEADER))
            .and_then(|v| v.to_str().ok())
            .map(|client| {
                inner
                    .in_flight
                    .register(&intake::in_flight_key(&tenant.name, client), id)
            });
        let by_notification = registration.as_ref().map(|r| &r.cancelled);
        let mut handle = inner.executor.start(
            CallRequest {
                call_id: String::new(),
                tool: request.name.into_owned(),
                arguments_json,
                timeout_ms,
                session_id,
                tenant: Some(tenant),
            },
            &inner.hard_stop,
            live.is_some(),
        );
        let cancelled = async {
            match (ct, by_notification) {
                (Some(a), Some(b)) => tokio::select! {
                    _ = a.cancelled() => {}
                    _ = b.cancelled() => {}
                },
                (Some(t), None) | (None, Some(t)) => t.cancelled().await,
                (None, None) => std::future::pending().await,
            }
        };
        tokio::pin!(cancelled);
        let mut sent: u64 = 0;
        let outcome = loop {
            let event = tokio::select! {
                // Dropping the handle cancels the call and kills its sandbox.
                _ = &mut cancelled => break None,
                e = handle.next() => e,
            };
            match event {
                Some(CallEvent::Done(outcome)) => break Some(outcome),
                Some(CallEvent::Chunk(chunk)) => {
                    let Some((token, peer)) = &live else { continue };
                    let p = match chunk {
                        StreamChunk::Stdout(s) => {
                            sent += s.len() as u64;
                            progress(token, sent, "stdout", s)
                        }
                        StreamChunk::Stderr(s) => {
                            sent += s.len() as u64;
                            progress(token, sent, "stderr", s)
                        }
                        StreamChunk::Approval(a) => {
                            sent += 1;
                            let mut p = progress(
                                token,
                                sent,
                                "approval",
                                format!(
                                    "waiting for approval {} ({}): {}; decide with `toolrun approve {}` or `toolrun deny {}`",
                                    a.approval_id,
                                    a.kind.as_str(),
                                    a.reason,
                                    a.approval_id,
                                    a.approval_id
                                ),
                            );
                            if let Some(m) = p.meta.as_mut() {
                                m.0.0.insert(
                                    meta_keys::APPROVAL.into(),
                                    json!({
                                        "approval_id": a.approval_id,
                                        "session_id": a.session_id,
                                        "tool": a.tool,
                                        "kind": a.kind.as_str(),
                                        "reason": a.reason,
                                    }),
                                );
                            }
                            p
                        }
                    };
                    // A client that stopped reading loses progress, not the call.
                    let _ = peer.notify_progress(p).await;
                }
                None => {
                    break Some(crate::exec::CallOutcome {
                        call_id: handle.call_id().to_string(),
                        tool: String::new(),
                        output_json: None,
                        output_hash: String::new(),
                        error: Some(ToolError::new(
                            ErrorCode::Internal,
                            "the call ended without a result",
                        )),
                        duration: Duration::ZERO,
                    });
                }
            }
        };
        let Some(outcome) = outcome else {
            drop(handle);
            let e = ToolError::new(ErrorCode::Cancelled, "the client cancelled the call");
            return Ok(tools::error_result(&e, None).into());
        };
        if let Some(e) = &outcome.error
            && e.code == ErrorCode::UnknownTool
        {
            return Err(McpError::invalid_params(
                e.message.clone(),
                Some(json!({"code": e.code.as_str(), "details": e.details})),
            ));
        }
        Ok(tools::call_result(outcome).into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(uri: &str, header: Option<&str>) -> http::request::Parts {
        let mut b = http::Request::builder().uri(uri);
        if let Some(h) = header {
            b = b.header(SESSION_ID_HEADER, h);
        }
        b.body(()).unwrap().into_parts().0
    }

    #[test]
    fn a_session_is_named_once_in_any_of_three_places() {
        let none = serde_json::Map::new();
        let mut meta = serde_json::Map::new();
        meta.insert(meta_keys::SESSION_ID.into(), json!("s1"));
        assert_eq!(session_id(&none, None).unwrap(), "");
        assert_eq!(session_id(&meta, None).unwrap(), "s1");
        assert_eq!(
            session_id(&none, Some(&parts("/?session_id=s2", None))).unwrap(),
            "s2"
        );
        assert_eq!(
            session_id(&none, Some(&parts("/", Some("s3")))).unwrap(),
            "s3"
        );
        assert_eq!(
            session_id(&meta, Some(&parts("/?session_id=s1", Some("s1")))).unwrap(),
            "s1"
        );
        let e = session_id(&meta, Some(&parts("/", Some("other")))).unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidArguments);
        assert!(e.message.contains("two session ids"), "{}", e.message);
        let mut bad = serde_json::Map::new();
        bad.insert(meta_keys::SESSION_ID.into(), json!(5));
        assert!(session_id(&bad, None).is_err());
    }

    #[test]
    fn a_timeout_in_meta_is_positive_ms() {
        let mut meta = serde_json::Map::new();
        assert_eq!(timeout_ms(&meta).unwrap(), 0);
        meta.insert(meta_keys::TIMEOUT_MS.into(), json!(1500));
        assert_eq!(timeout_ms(&meta).unwrap(), 1500);
        for bad in [json!(0), json!(-1), json!("1"), json!(1.5)] {
            meta.insert(meta_keys::TIMEOUT_MS.into(), bad);
            assert!(timeout_ms(&meta).is_err());
        }
    }
}
