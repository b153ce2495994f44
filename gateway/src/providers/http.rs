//! HTTP front door for provider formats: `POST /v1/{provider}/tool-calls`.
//!
//! The body is an assistant message (or the provider's whole API response) in
//! `{provider}`'s format; the answer is `200` with the provider-shaped result message(s),
//! ready to append to the conversation (see [`super`]). The session comes from the
//! `session_id` query parameter or the `toolrun-session-id` header. Bodies are bounded
//! like gRPC messages (`--max-message-bytes`). Errors are JSON
//! `{"error": {"code", "message"}}`: `404 unknown_provider` (with the `providers` list),
//! `400 not_json` / `bad_message` / `no_tool_calls` / `bad_session`, `413 body_too_large` /
//! `too_many_calls`, `401 unauthenticated` (no valid API key, from the listener's auth
//! layer), `429 resource_exhausted` with `Retry-After` (every call of the message over the
//! tenant's limits). A failed call is not an error: it is that call's result.
//!
//! This module only builds the [`axum::Router`]; the MCP listener mounts it.

use std::collections::HashMap;
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::{Provider, ProviderError};
use crate::exec::Executor;

/// The header that names the session.
pub const SESSION_HEADER: &str = "toolrun-session-id";

/// What the endpoint runs on.
pub struct ProviderHttp {
    /// The one executor.
    pub executor: Arc<Executor>,
    /// Cancels every call still running when the server gives up draining.
    pub hard_stop: CancellationToken,
    /// Largest body accepted (the gRPC message bound).
    pub max_body_bytes: usize,
}

/// `POST /v1/{provider}/tool-calls`, with the body bound applied.
pub fn router(state: Arc<ProviderHttp>) -> Router {
    let limit = state.max_body_bytes;
    Router::new()
        .route("/v1/{provider}/tool-calls", post(tool_calls))
        .layer(DefaultBodyLimit::max(limit))
        .with_state(state)
}

fn all_over_limit(outcomes: &[crate::exec::CallOutcome]) -> bool {
    !outcomes.is_empty()
        && outcomes.iter().all(|o| {
            o.error
                .as_ref()
                .is_some_and(|e| e.code == crate::error::ErrorCode::ResourceExhausted)
        })
}

fn error(status: StatusCode, code: &str, message: String) -> Response {
    (
        status,
        axum::Json(json!({"error": {"code": code, "message": message}})),
    )
        .into_response()
}

fn provider_error(e: ProviderError) -> Response {
    let message = e.to_string();
    match e {
        ProviderError::UnknownProvider(_) => {
            let providers: Vec<&str> = Provider::ALL.iter().map(|p| p.name()).collect();
            (
                StatusCode::NOT_FOUND,
                axum::Json(json!({"error": {
                    "code": "unknown_provider",
                    "message": message,
                    "providers": providers,
                }})),
            )
                .into_response()
        }
        ProviderError::NotJson(_) => error(StatusCode::BAD_REQUEST, "not_json", message),
        ProviderError::BadMessage { .. } => error(StatusCode::BAD_REQUEST, "bad_message", message),
        ProviderError::NoCalls(_) => error(StatusCode::BAD_REQUEST, "no_tool_calls", message),
        ProviderError::TooManyCalls(_) => {
            error(StatusCode::PAYLOAD_TOO_LARGE, "too_many_calls", message)
        }
    }
}

async fn tool_calls(
    State(state): State<Arc<ProviderHttp>>,
    caller: Option<axum::Extension<crate::auth::Caller>>,
    Path(provider): Path<String>,
    query: Result<Query<HashMap<String, String>>, QueryRejection>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let provider = match Provider::from_name(&provider) {
        Ok(p) => p,
        Err(e) => return provider_error(e),
    };
    let body = match body {
        Ok(b) => b,
        Err(rejection) => {
            let status = rejection.status();
            let code = if status == StatusCode::PAYLOAD_TOO_LARGE {
                "body_too_large"
            } else {
                "bad_body"
            };
            return error(
                status,
                code,
                format!(
                    "{} (the limit is {} bytes)",
                    rejection.body_text(),
                    state.max_body_bytes
                ),
            );
        }
    };
    let from_query = match query {
        Ok(Query(q)) => q.get("session_id").cloned(),
        Err(e) => return error(StatusCode::BAD_REQUEST, "bad_query", e.body_text()),
    };
    let from_header = match headers.get(SESSION_HEADER).map(|v| v.to_str()) {
        None => None,
        Some(Ok(v)) => Some(v.to_string()),
        Some(Err(_)) => {
            return error(
                StatusCode::BAD_REQUEST,
                "bad_session",
                format!("the {SESSION_HEADER} header is not visible ASCII"),
            );
        }
    };
    let session_id = match (from_query, from_header) {
        (Some(q), Some(h)) if q != h => {
            return error(
                StatusCode::BAD_REQUEST,
                "bad_session",
                format!("session_id {q:?} and the {SESSION_HEADER} header {h:?} differ"),
            );
        }
        (q, h) => q.or(h).unwrap_or_default(),
    };
    let Ok(text) = std::str::from_utf8(&body) else {
        return error(
            StatusCode::BAD_REQUEST,
            "not_json",
            "the body is not UTF-8".into(),
        );
    };
    // Dropped when the client goes away: every call still running is cancelled.
    match super::run(
        &state.executor,
        &state.hard_stop,
        provider,
        text,
        &session_id,
        &caller.map_or_else(crate::auth::Tenant::nobody, |c| c.0.0.clone()),
    )
    .await
    {
        // Every call refused for the tenant's limits: the transport's overload answer.
        Ok(ran) if all_over_limit(&ran.outcomes) => {
            let retry_ms = ran
                .outcomes
                .iter()
                .filter_map(|o| o.error.as_ref()?.details.as_ref()?["retry_after_ms"].as_u64())
                .min()
                .unwrap_or(1000);
            (
                StatusCode::TOO_MANY_REQUESTS,
                [(header::RETRY_AFTER, retry_ms.div_ceil(1000).to_string())],
                axum::Json(json!({"error": {
                    "code": "resource_exhausted",
                    "message": ran.outcomes[0].error.as_ref().map(|e| e.message.clone()).unwrap_or_default(),
                    "retry_after_ms": retry_ms,
                }})),
            )
                .into_response()
        }
        Ok(ran) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/json")],
            ran.results,
        )
            .into_response(),
        Err(e) => provider_error(e),
    }
}
