//! A session's file access, over either backend: the file-access core on the workspace's
//! directory handle (local), or the session pod's agent through the operator's
//! `toolrun.v1.SessionRelay` (kubernetes). Both run the same core (`toolrun-workspace`)
//! with the same argument and output JSON and the same typed error codes; the file tools
//! and the approval gate use only this type.

use std::sync::Arc;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use toolrun_proto::relay::session_relay_client::SessionRelayClient;
use toolrun_proto::relay::{FileOpRequest, file_op_reply};
use toolrun_runner::agent::proto::{ErrorCode as AgentCode, FileOpKind};
use toolrun_workspace::{FsError, UsageOutput, Workspace};

use crate::error::{ErrorCode, ToolError};

/// Largest relay message either way (the operator's bound): a 16 MiB file in base64 in JSON.
pub const MAX_RELAY_MESSAGE_BYTES: usize = 48 << 20;

/// Where a session's files are.
#[derive(Clone)]
pub enum SessionFiles {
    /// The gateway's own workspace directory.
    Local(Arc<Workspace>),
    /// A session pod, through the operator's relay.
    Remote(Box<RemoteFiles>),
}

impl std::fmt::Debug for SessionFiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SessionFiles::Local(_) => f.write_str("SessionFiles::Local"),
            SessionFiles::Remote(r) => write!(f, "SessionFiles::Remote({})", r.session),
        }
    }
}

/// The relay client of one session.
#[derive(Clone)]
pub struct RemoteFiles {
    client: RelayClient,
    /// The ToolSession's name.
    pub session: String,
    /// The owning tenant (checked by the operator against the ToolSession's label).
    pub tenant: String,
}

/// A connection to the operator's relay with its token: one per gateway, cheap to clone.
#[derive(Clone)]
pub struct RelayClient {
    inner: SessionRelayClient<tonic::transport::Channel>,
    authorization: tonic::metadata::MetadataValue<tonic::metadata::Ascii>,
    timeout: Duration,
}

impl RelayClient {
    /// A client of the relay at `address` (`http://host:port`), connecting lazily, sending
    /// `token` with every call; each call bounded by `timeout`.
    pub fn new(address: &str, token: &str, timeout: Duration) -> Result<RelayClient, String> {
        let endpoint = tonic::transport::Endpoint::from_shared(address.to_string())
            .map_err(|e| format!("relay address {address:?}: {e}"))?
            .connect_timeout(Duration::from_secs(5))
            .timeout(timeout);
        let authorization = format!("Bearer {}", token.trim())
            .parse()
            .map_err(|_| "the relay token is not valid header text".to_string())?;
        Ok(RelayClient {
            inner: SessionRelayClient::new(endpoint.connect_lazy())
                .max_decoding_message_size(MAX_RELAY_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_RELAY_MESSAGE_BYTES),
            authorization,
            timeout,
        })
    }

    /// The files of ToolSession `session` owned by `tenant`.
    pub fn files(&self, session: &str, tenant: &str) -> SessionFiles {
        SessionFiles::Remote(Box::new(RemoteFiles {
            client: self.clone(),
            session: session.to_string(),
            tenant: tenant.to_string(),
        }))
    }
}

/// The tool result of a file-access failure of the core.
pub fn fs_error(e: FsError) -> ToolError {
    use toolrun_workspace::FsErrorCode as F;
    let code = match e.code {
        F::InvalidPath => ErrorCode::InvalidPath,
        F::FileNotFound => ErrorCode::FileNotFound,
        F::AlreadyExists => ErrorCode::AlreadyExists,
        F::NotADirectory => ErrorCode::NotADirectory,
        F::IsADirectory => ErrorCode::IsADirectory,
        F::NoMatch => ErrorCode::NoMatch,
        F::AmbiguousMatch => ErrorCode::AmbiguousMatch,
        F::QuotaExceeded => ErrorCode::QuotaExceeded,
        F::PermissionDenied => ErrorCode::PermissionDenied,
        F::InvalidArguments => ErrorCode::InvalidArguments,
        _ => ErrorCode::ExecutionError,
    };
    let mut err = ToolError::new(code, e.message);
    if let Some(d) = e.details {
        err = err.with_details(d);
    }
    err
}

/// The tool result of a relay error: the core's codes exactly as locally, the relay's own
/// as SESSION_NOT_FOUND or UNAVAILABLE.
pub fn relay_error(code: &str, message: String, details_json: &str) -> ToolError {
    let details: Option<Value> = serde_json::from_str(details_json).ok();
    let agent: Option<AgentCode> = serde_json::from_value(Value::String(code.into())).ok();
    if let Some(fs) = agent.and_then(AgentCode::fs_code) {
        return fs_error(FsError {
            code: fs,
            message,
            details,
        });
    }
    let mapped = match code {
        "SESSION_NOT_FOUND" => ErrorCode::SessionNotFound,
        "SESSION_NOT_READY" | "AGENT_UNREACHABLE" => ErrorCode::Unavailable,
        "UNKNOWN_OP" | "BAD_REQUEST" => ErrorCode::InvalidArguments,
        _ => ErrorCode::ExecutionError,
    };
    let err = ToolError::new(mapped, format!("{message} ({code})"));
    match details {
        Some(d) => err.with_details(d),
        None => err,
    }
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, FsError> + Send + 'static,
) -> Result<T, ToolError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ToolError::new(ErrorCode::Internal, format!("file task: {e}")))?
        .map_err(fs_error)
}

fn parse<T: DeserializeOwned>(kind: FileOpKind, v: Value) -> Result<T, ToolError> {
    serde_json::from_value(v).map_err(|e| {
        ToolError::new(
            ErrorCode::ExecutionError,
            format!("{}: unexpected answer: {e}", kind.as_str()),
        )
    })
}

impl RemoteFiles {
    /// Runs `kind` with `args` in the session pod: the core's output JSON, or its error.
    pub async fn call(&self, kind: FileOpKind, args: &Value) -> Result<Value, ToolError> {
        let mut request = tonic::Request::new(FileOpRequest {
            session: self.session.clone(),
            tenant: self.tenant.clone(),
            request_id: uuid::Uuid::new_v4().simple().to_string(),
            op: kind.as_str().into(),
            args_json: args.to_string(),
        });
        request
            .metadata_mut()
            .insert("authorization", self.client.authorization.clone());
        request.set_timeout(self.client.timeout);
        let reply = self
            .client
            .inner
            .clone()
            .file_op(request)
            .await
            .map_err(|s| {
                ToolError::new(
                    ErrorCode::Unavailable,
                    format!("the session relay failed: {}: {}", s.code(), s.message()),
                )
            })?
            .into_inner();
        match reply.outcome {
            Some(file_op_reply::Outcome::ResultJson(j)) => serde_json::from_str(&j).map_err(|e| {
                ToolError::new(
                    ErrorCode::ExecutionError,
                    format!("the relay's answer is not JSON: {e}"),
                )
            }),
            Some(file_op_reply::Outcome::Error(e)) => {
                Err(relay_error(&e.code, e.message, &e.details_json))
            }
            None => Err(ToolError::new(
                ErrorCode::ExecutionError,
                "the relay answered nothing",
            )),
        }
    }
}

impl SessionFiles {
    /// The local workspace, when the files are here.
    pub fn local(&self) -> Option<&Arc<Workspace>> {
        match self {
            SessionFiles::Local(ws) => Some(ws),
            SessionFiles::Remote(_) => None,
        }
    }

    /// Runs file operation `kind` with the tool's JSON arguments; its JSON output.
    pub async fn call(&self, kind: FileOpKind, args: &Value) -> Result<Value, ToolError> {
        match self {
            SessionFiles::Local(ws) => {
                let (ws, args) = (ws.clone(), args.clone());
                let out = tokio::task::spawn_blocking(move || {
                    toolrun_runner::agent::files::dispatch(&ws, kind, &args)
                })
                .await
                .map_err(|e| ToolError::new(ErrorCode::Internal, format!("file task: {e}")))?;
                out.map_err(|e| relay_error(&e.code.as_str(), e.message, &detail_text(e.details)))
            }
            SessionFiles::Remote(r) => r.call(kind, args).await,
        }
    }

    /// Something (file, directory, symlink) is at `path`.
    pub async fn exists(&self, path: &str) -> Result<bool, ToolError> {
        match self {
            SessionFiles::Local(ws) => {
                let (ws, path) = (ws.clone(), path.to_string());
                blocking(move || ws.exists(&path)).await
            }
            SessionFiles::Remote(r) => {
                let out = r.call(FileOpKind::Exists, &json!({ "path": path })).await?;
                Ok(
                    parse::<toolrun_runner::agent::proto::ExistsOutput>(FileOpKind::Exists, out)?
                        .exists,
                )
            }
        }
    }

    /// The workspace-relative form of directory `path` (`""`: the root).
    pub async fn resolve_dir(&self, path: &str) -> Result<String, ToolError> {
        match self {
            SessionFiles::Local(ws) => {
                let (ws, path) = (ws.clone(), path.to_string());
                blocking(move || ws.resolve_dir(&path)).await
            }
            SessionFiles::Remote(r) => {
                let out = r
                    .call(FileOpKind::ResolveDir, &json!({ "path": path }))
                    .await?;
                Ok(parse::<toolrun_runner::agent::proto::ResolveDirOutput>(
                    FileOpKind::ResolveDir,
                    out,
                )?
                .path)
            }
        }
    }

    /// The workspace's usage as the file-access core walks it (locally the walk of the
    /// directory; on kubernetes the session pod's agent walks its volume and knows its
    /// size).
    pub async fn usage(&self) -> Result<UsageOutput, ToolError> {
        match self {
            SessionFiles::Local(ws) => {
                let ws = ws.clone();
                blocking(move || ws.usage()).await
            }
            SessionFiles::Remote(r) => {
                let out = r.call(FileOpKind::Usage, &json!({})).await?;
                parse(FileOpKind::Usage, out)
            }
        }
    }

    /// The diff a write_file (`PreviewWrite`) or edit (`PreviewEdit`) with `args` would
    /// make; its error message when it could not be computed.
    pub async fn preview(&self, kind: FileOpKind, args: &Value) -> String {
        match self.call(kind, args).await {
            Ok(out) => match parse::<toolrun_runner::agent::proto::PreviewOutput>(kind, out) {
                Ok(p) => p.diff,
                Err(e) => e.message,
            },
            Err(e) => e.message,
        }
    }
}

fn detail_text(d: Option<Value>) -> String {
    d.map(|d| d.to_string()).unwrap_or_default()
}
