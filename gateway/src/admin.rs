//! The admin HTTP port: `/healthz`, `/readyz`, `/metrics`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use serde_json::json;

use crate::metrics::Metrics;
use crate::sandbox::SandboxInfo;

/// What the admin endpoints report.
pub struct AdminState {
    /// Set once the gRPC listener is bound; cleared when shutdown begins.
    pub ready: AtomicBool,
    /// Metrics to expose.
    pub metrics: Arc<Metrics>,
    /// Sessions, when served (their gauges are read at each scrape).
    pub sessions: Option<Arc<crate::session::SessionManager>>,
    /// Sandbox backend and mechanisms (None when no sandboxed tool is enabled).
    pub sandbox: Option<SandboxInfo>,
    /// The gRPC address.
    pub grpc_addr: String,
    /// Each language run_code accepts, with its interpreter's and libraries' availability,
    /// as probed once at start through the sandbox (`{"probing": true}` until done).
    pub languages: Arc<std::sync::Mutex<serde_json::Value>>,
    /// Custom tools: each declaration's verdict (served, or refused and why).
    pub custom_tools: Option<Arc<crate::tools::custom_reload::CustomTools>>,
}

/// The admin router.
pub fn router(state: Arc<AdminState>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(state)
}

async fn readyz(State(s): State<Arc<AdminState>>) -> impl IntoResponse {
    let ready = s.ready.load(Ordering::Acquire);
    let body = json!({
        "ready": ready,
        "grpc": s.grpc_addr,
        "sandbox": s.sandbox,
        "languages": s.languages.lock().unwrap_or_else(|e| e.into_inner()).clone(),
        "custom_tools": s.custom_tools.as_ref().map(|c| c.status()),
    });
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, axum::Json(body))
}

async fn metrics(State(s): State<Arc<AdminState>>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        {
            if let Some(m) = &s.sessions {
                s.metrics.sessions_open.set(m.list().len() as i64);
                s.metrics.approvals_pending.set(m.approvals().len() as i64);
            }
            s.metrics.encode()
        },
    )
}
