//! What every `POST /mcp` passes before rmcp sees it:
//!
//! - The body is read up to the gateway's message limit; more is `413` with the limit named
//!   (a JSON-RPC error body, so clients show the message).
//! - It must be one JSON-RPC message: malformed JSON (or nesting past serde_json's depth
//!   limit) is `400` with JSON-RPC `-32700`; a batch (a JSON array; MCP dropped batching in
//!   2025-06-18) or a non-object is `400` with `-32600` (SECURITY-CASES.md 54).
//! - Cancellation at the handshake versions (2025-06-18, 2025-11-25): the client POSTs
//!   `notifications/cancelled{requestId}` while the call's own POST is still open. The
//!   server is stateless (any replica answers any request), so rmcp drops notifications;
//!   this layer answers it instead, cancelling the call of that request id from the same
//!   client. "The same client" is the `Mcp-Session-Id` the client echoes: this layer stamps
//!   a random one on each `initialize` answer (no server state behind it; it only scopes
//!   cancellations, so one client cannot cancel another's calls). At 2026-07-28 a client
//!   cancels by closing the call's response stream, which rmcp turns into cancellation.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use http::{HeaderValue, Method, StatusCode};
use rmcp::model::{CallToolRequestParams, JsonRpcVersion2_0, RequestId};
use serde::Deserialize;
use serde::de::IgnoredAny;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

/// The header a Streamable HTTP client echoes on every request after `initialize`.
pub const SESSION_HEADER: &str = "mcp-session-id";

/// Calls in flight from clients that cancel by notification, by (client, request id).
#[derive(Default)]
pub struct InFlight {
    calls: Mutex<HashMap<(String, String), (u64, CancellationToken)>>,
    serial: AtomicU64,
}

/// A call's entry in [`InFlight`]; removed when dropped.
pub struct Registration {
    table: Arc<InFlight>,
    key: (String, String),
    serial: u64,
    /// Fired by the client's `notifications/cancelled`.
    pub cancelled: CancellationToken,
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut calls = self.table.calls.lock().unwrap_or_else(|e| e.into_inner());
        // A client that reused the id for a newer call keeps that one's entry.
        if calls.get(&self.key).is_some_and(|(s, _)| *s == self.serial) {
            calls.remove(&self.key);
        }
    }
}

fn id_key(id: &RequestId) -> String {
    match id {
        RequestId::Number(n) => format!("n:{n}"),
        RequestId::String(s) => format!("s:{s}"),
    }
}

fn value_key(id: &Value) -> Option<String> {
    match id {
        Value::Number(n) => n.as_i64().map(|n| format!("n:{n}")),
        Value::String(s) => Some(format!("s:{s}")),
        _ => None,
    }
}

/// The in-flight table's client key: the tenant and the client's `mcp-session-id`.
pub fn in_flight_key(tenant: &str, client: &str) -> String {
    format!("{tenant}\n{client}")
}

impl InFlight {
    /// Registers request `id` of `client`.
    pub fn register(self: &Arc<Self>, client: &str, id: &RequestId) -> Registration {
        let key = (client.to_string(), id_key(id));
        let serial = self.serial.fetch_add(1, Ordering::Relaxed);
        let cancelled = CancellationToken::new();
        self.calls
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key.clone(), (serial, cancelled.clone()));
        Registration {
            table: self.clone(),
            key,
            serial,
            cancelled,
        }
    }

    /// Cancels request `id` of `client`; false when no such call is in flight.
    fn cancel(&self, client: &str, id: &Value) -> bool {
        let Some(id) = value_key(id) else {
            return false;
        };
        let token = self
            .calls
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&(client.to_string(), id))
            .map(|(_, t)| t.clone());
        token.map(|t| t.cancel()).is_some()
    }

    /// Calls registered now.
    pub fn len(&self) -> usize {
        self.calls.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// No call is registered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The layer's state.
pub struct Intake {
    /// Largest body, bytes.
    pub max_body_bytes: usize,
    /// Calls that a notification may cancel.
    pub in_flight: Arc<InFlight>,
    /// Answers the `tools/call`s taken off rmcp's path ([`DirectCall`]).
    pub handler: super::McpHandler,
}

/// A `tools/call` answered without rmcp's per-request service. In stateless mode rmcp
/// builds one for every POST (a peer, channels, a service loop and three tasks) only to
/// run one handler and write one JSON answer; for the common call that is most of the
/// request's cost. Taken here only when rmcp would do nothing but that: the client
/// accepts JSON and event streams and posts JSON, at a handshake version (2025-06-18,
/// 2025-11-25: no per-request metadata or standard headers to check), the message has
/// exactly the JSON-RPC members with rmcp's own parameter type, and `_meta` asks for no
/// progress (which needs an event stream) and names no protocol version. Anything else
/// goes to rmcp as before.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DirectCall {
    #[serde(rename = "jsonrpc")]
    _version: JsonRpcVersion2_0,
    /// The request id, echoed in the answer.
    pub id: RequestId,
    #[serde(rename = "method")]
    _method: IgnoredAny,
    /// The call, parsed as rmcp parses it.
    pub params: CallToolRequestParams,
}

/// Protocol versions whose `tools/call` needs no more checks than [`DirectCall`]'s.
const DIRECT_VERSIONS: [&str; 2] = ["2025-06-18", "2025-11-25"];

/// `body` as a [`DirectCall`], when the request qualifies (see there).
fn direct_call(parts: &http::request::Parts, body: &[u8]) -> Option<DirectCall> {
    let header = |name| {
        let mut all = parts.headers.get_all(name).iter();
        let first = all.next()?.to_str().ok()?;
        all.next().is_none().then_some(first)
    };
    if !DIRECT_VERSIONS.contains(&header("mcp-protocol-version")?) {
        return None;
    }
    let essence = |v: &str| v.split(';').next().unwrap_or_default().trim().to_string();
    if !essence(header(http::header::CONTENT_TYPE.as_str())?).eq_ignore_ascii_case(JSON) {
        return None;
    }
    // Plain media types only: weights and parameters are rmcp's to read.
    let accept = header(http::header::ACCEPT.as_str())?;
    if accept.contains(['"', ';']) {
        return None;
    }
    let accepts = |t: &str| accept.split(',').any(|a| a.trim().eq_ignore_ascii_case(t));
    if !accepts(JSON) || !accepts("text/event-stream") {
        return None;
    }
    let call: DirectCall = serde_json::from_slice(body).ok()?;
    let meta = call.params.meta.as_ref().map(|m| &m.0.0);
    if meta.is_some_and(|m| {
        m.contains_key("progressToken")
            || m.keys().any(|k| k.starts_with("io.modelcontextprotocol/"))
    }) {
        return None;
    }
    Some(call)
}

const JSON: &str = "application/json";

/// Deepest nesting of arrays and objects accepted (serde_json, which rmcp parses with, stops
/// at 128 and would answer with an untyped 415).
pub const MAX_DEPTH: usize = 100;

/// The nesting level past [`MAX_DEPTH`] that `json` reaches first, if any (brackets inside
/// strings do not count).
fn too_deep(json: &[u8]) -> Option<usize> {
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    for &b in json {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                if depth > MAX_DEPTH {
                    return Some(depth);
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    None
}

/// Only the method: enough to route, and parsing it checks the whole body's syntax.
#[derive(Deserialize)]
struct Peek<'a> {
    #[serde(borrow, default)]
    method: Option<Cow<'a, str>>,
    #[serde(default)]
    #[allow(dead_code)]
    params: Option<IgnoredAny>,
}

/// Most bytes of an oversized body read (and dropped) so that the client, which sends its
/// whole body before it reads, sees the 413 instead of a reset connection.
const DRAIN_BYTES: usize = 64 * 1024 * 1024;
/// Longest time spent draining it.
const DRAIN_TIME: Duration = Duration::from_secs(5);

/// `413` naming the limit, as a JSON-RPC error (clients surface its message), after
/// draining the rest of the body within [`DRAIN_BYTES`] and [`DRAIN_TIME`]; memory stays
/// flat (nothing is kept).
async fn too_large(limit: usize, declared: Option<u64>, mut rest: BodyStream) -> Response {
    let size = declared.map_or_else(String::new, |n| format!(" of {n} bytes"));
    let message = format!(
        "Payload Too Large: the request body{size} exceeds the gateway's limit of {limit} bytes \
         (--max-message-bytes)"
    );
    tracing::warn!(limit, declared, "refused an oversized MCP request");
    let _ = tokio::time::timeout(DRAIN_TIME, async {
        let mut drained = 0usize;
        while let Some(Ok(chunk)) = rest.next().await {
            drained += chunk.len();
            if drained > DRAIN_BYTES {
                break;
            }
        }
    })
    .await;
    jsonrpc_error_status(StatusCode::PAYLOAD_TOO_LARGE, -32600, message)
}

type BodyStream = axum::body::BodyDataStream;

fn jsonrpc_error(code: i64, message: String) -> Response {
    jsonrpc_error_status(StatusCode::BAD_REQUEST, code, message)
}

fn jsonrpc_error_status(status: StatusCode, code: i64, message: String) -> Response {
    (
        status,
        [(http::header::CONTENT_TYPE, "application/json")],
        json!({"jsonrpc": "2.0", "id": null, "error": {"code": code, "message": message}})
            .to_string(),
    )
        .into_response()
}

/// The middleware (see the module docs).
pub async fn intake(State(st): State<Arc<Intake>>, req: Request, next: Next) -> Response {
    if req.method() != Method::POST {
        return next.run(req).await;
    }
    let limit = st.max_body_bytes;
    let declared = req
        .headers()
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let (parts, body) = req.into_parts();
    let mut stream = body.into_data_stream();
    if declared.is_some_and(|n| n > limit as u64) {
        return too_large(limit, declared, stream).await;
    }
    let mut bytes = Vec::with_capacity(declared.map_or(0, |n| n as usize));
    while let Some(chunk) = stream.next().await {
        match chunk {
            Ok(chunk) if chunk.len() > limit - bytes.len() => {
                return too_large(limit, None, stream).await;
            }
            Ok(chunk) => bytes.extend_from_slice(&chunk),
            Err(e) => {
                return (
                    StatusCode::BAD_REQUEST,
                    format!("cannot read the request body: {e}\n"),
                )
                    .into_response();
            }
        }
    }
    let first = bytes.iter().find(|b| !b.is_ascii_whitespace()).copied();
    if first == Some(b'[') {
        return jsonrpc_error(
            -32600,
            "Invalid Request: JSON-RPC batches are not accepted (MCP removed batching in \
             2025-06-18); send one message per POST"
                .into(),
        );
    }
    if let Some(depth) = too_deep(&bytes) {
        return jsonrpc_error(
            -32600,
            format!("Invalid Request: JSON nested deeper than {MAX_DEPTH} levels (at {depth})"),
        );
    }
    let method = match serde_json::from_slice::<Peek>(&bytes) {
        Ok(p) => p.method.map(Cow::into_owned),
        Err(e) if e.is_syntax() || e.is_eof() => {
            return jsonrpc_error(-32700, format!("Parse error: {e}"));
        }
        Err(e) => {
            return jsonrpc_error(
                -32600,
                format!("Invalid Request: not a JSON-RPC message object: {e}"),
            );
        }
    };
    let client = parts
        .headers
        .get(SESSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    match method.as_deref() {
        Some("notifications/cancelled") => {
            let request_id = serde_json::from_slice::<Value>(&bytes)
                .ok()
                .and_then(|v| v.get("params")?.get("requestId").cloned());
            if let (Some(client), Some(id)) = (client, request_id) {
                // Only the tenant's own calls: another tenant using the same client id
                // cancels nothing.
                let tenant = crate::auth::Caller::of(&parts.extensions);
                let found = st
                    .in_flight
                    .cancel(&in_flight_key(&tenant.name, &client), &id);
                tracing::info!(request_id = %id, found, "MCP client cancelled a request");
            }
            // A notification gets no answer but "accepted", whatever it named.
            StatusCode::ACCEPTED.into_response()
        }
        Some("tools/call") => match direct_call(&parts, &bytes) {
            Some(call) => st.handler.answer(call, &parts).await,
            None => {
                next.run(Request::from_parts(parts, Body::from(bytes)))
                    .await
            }
        },
        Some("initialize") if client.is_none() => {
            let mut resp = next
                .run(Request::from_parts(parts, Body::from(bytes)))
                .await;
            if resp.status().is_success() {
                let id = uuid::Uuid::new_v4().simple().to_string();
                if let Ok(v) = HeaderValue::from_str(&id) {
                    resp.headers_mut().insert(SESSION_HEADER, v);
                }
            }
            resp
        }
        _ => {
            next.run(Request::from_parts(parts, Body::from(bytes)))
                .await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(headers: &[(&str, &str)]) -> http::request::Parts {
        let mut b = http::Request::builder().method("POST").uri("/mcp");
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        b.body(()).unwrap().into_parts().0
    }

    const PLAIN: [(&str, &str); 3] = [
        ("content-type", "application/json"),
        ("accept", "application/json, text/event-stream"),
        ("mcp-protocol-version", "2025-11-25"),
    ];

    #[test]
    fn only_plain_calls_at_handshake_versions_take_the_direct_path() {
        let call = |params: Value| {
            json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}).to_string()
        };
        let plain = call(json!({"name": "echo", "arguments": {"message": "hi"}}));
        let with_session = call(json!({"name": "echo", "_meta": {"toolrun.dev/session_id": "s"}}));
        for version in ["2025-06-18", "2025-11-25"] {
            let mut h = PLAIN;
            h[2].1 = version;
            let c = direct_call(&parts(&h), plain.as_bytes()).expect(version);
            assert_eq!(c.params.name, "echo");
            assert_eq!(c.id, RequestId::Number(1));
        }
        assert!(direct_call(&parts(&PLAIN), with_session.as_bytes()).is_some());
        // rmcp's: other versions (or none), other media types, weighted Accept, progress,
        // per-request versions, stray members, parameters rmcp would refuse.
        let refused: [(&[(&str, &str)], String); 11] = [
            (&PLAIN[..2], plain.clone()),
            (&[PLAIN[0], PLAIN[1], ("mcp-protocol-version", "2026-07-28")], plain.clone()),
            (&[PLAIN[0], PLAIN[1], ("mcp-protocol-version", "2025-03-26")], plain.clone()),
            (&[("content-type", "text/plain"), PLAIN[1], PLAIN[2]], plain.clone()),
            (&[PLAIN[0], ("accept", "application/json"), PLAIN[2]], plain.clone()),
            (
                &[PLAIN[0], ("accept", "application/json;q=0, text/event-stream"), PLAIN[2]],
                plain.clone(),
            ),
            (&PLAIN, call(json!({"name": "echo", "_meta": {"progressToken": 1}}))),
            (
                &PLAIN,
                call(json!({"name": "echo",
                    "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28"}})),
            ),
            (
                &PLAIN,
                r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo"},"result":{}}"#
                    .into(),
            ),
            (&PLAIN, call(json!({"name": "echo", "arguments": [1]}))),
            (&PLAIN, r#"{"jsonrpc":"1.0","id":1,"method":"tools/call","params":{"name":"echo"}}"#.into()),
        ];
        for (headers, body) in refused {
            assert!(
                direct_call(&parts(headers), body.as_bytes()).is_none(),
                "{headers:?} {body}"
            );
        }
    }

    #[test]
    fn nesting_is_counted_outside_strings() {
        let deep = |n: usize| format!("{}1{}", "[".repeat(n), "]".repeat(n));
        assert_eq!(too_deep(deep(MAX_DEPTH).as_bytes()), None);
        assert_eq!(
            too_deep(deep(MAX_DEPTH + 1).as_bytes()),
            Some(MAX_DEPTH + 1)
        );
        let quoted = format!("{{\"a\": \"{}\\\"{}\"}}", "[".repeat(500), "{".repeat(500));
        assert_eq!(too_deep(quoted.as_bytes()), None, "{quoted}");
    }
}
