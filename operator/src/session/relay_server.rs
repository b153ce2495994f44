//! `toolrun.v1.SessionRelay` (proto/toolrun/v1/relay.proto): the gateway's only way into a
//! session pod. The operator serves it on `--relay-listen` (off by default; the chart sets
//! `0.0.0.0:50052`, a ClusterIP Service whose NetworkPolicy admits only the gateway's pods).
//!
//! Each `FileOp`:
//! 1. must carry `authorization: Bearer <token>`, the content of `--relay-token-file` (a
//!    Secret mounted by the gateway and the operator); otherwise `UNAUTHENTICATED`;
//! 2. names a ToolSession of the sandbox namespace whose `toolrun.dev/tenant` label equals
//!    the request's tenant; otherwise `SESSION_NOT_FOUND` (another tenant's session does not
//!    exist for the caller); without a Ready pod `SESSION_NOT_READY` with the status message;
//! 3. must be a file op of the agent (read_file ... resolve_dir, and `usage`, the
//!    workspace's usage for GetSession): a `run`, `kill` or any other op is refused
//!    (`UNKNOWN_OP`), so the relay cannot be used to run programs;
//! 4. is forwarded to the agent of `status.podName` over the pod's one shared attach stream
//!    ([`crate::relay::Pool`]), with the request id prefixed `f-` (the agent executes an id
//!    at most once); the agent's output or typed error comes back unchanged. An agent that
//!    cannot be reached within the retry budget or the call bound is `AGENT_UNREACHABLE`.
//!
//! Every call is logged (session, tenant, op, outcome, duration): the audit of file tools on
//! Kubernetes.

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::Value;
use tokio_util::sync::CancellationToken;
use toolrun_crd::ToolSession;
use toolrun_crd::session::AGENT_CONTAINER;
use toolrun_proto::relay::session_relay_server::{SessionRelay, SessionRelayServer};
use toolrun_proto::relay::{FileOpReply, FileOpRequest, RelayError as WireError, file_op_reply};
use toolrun_runner::agent::proto::{Body, Request};

use crate::relay::{Connection, Pool};

/// Largest gRPC message either way: a 16 MiB file in base64 inside JSON, with room.
pub const MAX_MESSAGE_BYTES: usize = 48 << 20;
/// Longest request id the gateway may send (the agent's bound is 256 bytes with our prefix).
pub const MAX_REQUEST_ID_BYTES: usize = 200;

/// Relay codes (beside the agent's own, which pass through).
pub mod codes {
    /// No ToolSession of that name for this tenant.
    pub const SESSION_NOT_FOUND: &str = "SESSION_NOT_FOUND";
    /// The ToolSession has no Ready pod.
    pub const SESSION_NOT_READY: &str = "SESSION_NOT_READY";
    /// The agent could not be reached or did not answer in time.
    pub const AGENT_UNREACHABLE: &str = "AGENT_UNREACHABLE";
    /// The agent answered something the relay cannot use.
    pub const RELAY_ERROR: &str = "RELAY_ERROR";
    /// Not a file op of the agent.
    pub const UNKNOWN_OP: &str = "UNKNOWN_OP";
    /// Malformed request fields.
    pub const INVALID_ARGUMENTS: &str = "INVALID_ARGUMENTS";
}

/// Where the relay listens and its token (from the operator's flags).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelayServerConfig {
    /// Listen address (`--relay-listen`).
    pub listen: SocketAddr,
    /// File holding the bearer token (`--relay-token-file`).
    pub token_file: PathBuf,
    /// Longest one file op may take end to end (reattaches included).
    pub call_timeout: Duration,
}

impl RelayServerConfig {
    /// Listening on `listen` with the token in `token_file`, calls bounded at 60 s.
    pub fn new(listen: SocketAddr, token_file: PathBuf) -> Self {
        RelayServerConfig {
            listen,
            token_file,
            call_timeout: Duration::from_secs(60),
        }
    }

    /// Reads the token: non-empty, surrounding whitespace trimmed.
    pub fn read_token(&self) -> Result<String, String> {
        let text = std::fs::read_to_string(&self.token_file)
            .map_err(|e| format!("reading the relay token {}: {e}", self.token_file.display()))?;
        let token = text.trim().to_string();
        if token.len() < 16 {
            return Err(format!(
                "the relay token in {} is shorter than 16 characters",
                self.token_file.display()
            ));
        }
        Ok(token)
    }
}

/// What the relay needs to know of a session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionTarget {
    /// The `toolrun.dev/tenant` label (empty: none).
    pub tenant: String,
    /// The pod serving it, when it is Ready.
    pub pod: Option<String>,
    /// Its phase and message, for `SESSION_NOT_READY`.
    pub state: String,
}

type Lookup<'a> = Pin<Box<dyn Future<Output = Result<Option<SessionTarget>, String>> + Send + 'a>>;

/// Finds sessions by name (the Kubernetes API in the operator; a table in tests).
pub trait Sessions: Send + Sync + 'static {
    /// The session named `name`, if it exists.
    fn lookup(&self, name: &str) -> Lookup<'_>;
}

/// Gives the connection to a pod's agent (the operator's [`Pool`]; local agents in tests).
pub trait Agents: Send + Sync + 'static {
    /// The one shared connection to `pod`'s agent.
    fn connection(&self, pod: &str) -> Connection;
}

impl Agents for Pool {
    fn connection(&self, pod: &str) -> Connection {
        self.get(pod)
    }
}

/// Sessions read from ToolSessions of one namespace: a watch-fed cache first, and a GET
/// when the cache does not (yet) show a Ready session, so a session the gateway just saw
/// Ready is found.
pub struct KubeSessions {
    api: Api<ToolSession>,
    store: Store<ToolSession>,
    namespace: String,
}

impl KubeSessions {
    /// Starts the watch on ToolSessions of `namespace` until `stop`.
    pub fn start(client: kube::Client, namespace: &str, stop: CancellationToken) -> KubeSessions {
        use futures::StreamExt;
        let api: Api<ToolSession> = Api::namespaced(client, namespace);
        let (store, writer) = reflector::store();
        let stream = reflector::reflector(writer, watcher(api.clone(), watcher::Config::default()))
            .default_backoff()
            .touched_objects();
        tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    next = stream.next() => match next {
                        Some(Ok(_)) => {}
                        Some(Err(e)) => tracing::debug!(error = %e, "ToolSession watch"),
                        None => return,
                    }
                }
            }
        });
        KubeSessions {
            api,
            store,
            namespace: namespace.to_string(),
        }
    }
}

fn target(s: &ToolSession) -> SessionTarget {
    let status = s.status.as_ref();
    SessionTarget {
        tenant: s.tenant().to_string(),
        pod: s.ready_pod().map(str::to_string),
        state: format!(
            "phase {}{}",
            status
                .and_then(|s| s.phase)
                .map_or("(none yet)", |p| p.as_str()),
            status
                .and_then(|s| s.message.as_deref())
                .map(|m| format!(": {m}"))
                .unwrap_or_default()
        ),
    }
}

impl Sessions for KubeSessions {
    fn lookup(&self, name: &str) -> Lookup<'_> {
        let name = name.to_string();
        Box::pin(async move {
            let cached = self
                .store
                .get(&ObjectRef::new(&name).within(&self.namespace));
            if let Some(s) = cached.as_deref()
                && s.ready_pod().is_some()
            {
                return Ok(Some(target(s)));
            }
            match self.api.get_opt(&name).await {
                Ok(found) => Ok(found.as_ref().map(target)),
                Err(e) => Err(format!("reading ToolSession {name}: {e}")),
            }
        })
    }
}

/// The `SessionRelay` service.
pub struct RelayService {
    token: String,
    sessions: Arc<dyn Sessions>,
    agents: Arc<dyn Agents>,
    call_timeout: Duration,
    max_attempts: u32,
}

impl RelayService {
    /// A service checking `token`, finding sessions with `sessions` and agents with
    /// `agents`; each call bounded by `call_timeout`.
    pub fn new(
        token: String,
        sessions: Arc<dyn Sessions>,
        agents: Arc<dyn Agents>,
        call_timeout: Duration,
    ) -> RelayService {
        RelayService {
            token,
            sessions,
            agents,
            call_timeout,
            max_attempts: crate::relay::DEFAULT_MAX_ATTEMPTS,
        }
    }

    /// Reattach attempts per call (default [`crate::relay::DEFAULT_MAX_ATTEMPTS`]).
    pub fn with_max_attempts(mut self, n: u32) -> Self {
        self.max_attempts = n;
        self
    }

    /// As a tonic service, with the message bounds set.
    pub fn into_server(self) -> SessionRelayServer<RelayService> {
        SessionRelayServer::new(self)
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES)
    }

    fn authorized(&self, metadata: &tonic::metadata::MetadataMap) -> bool {
        let Some(given) = metadata
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
        else {
            return false;
        };
        constant_time_eq(given.trim().as_bytes(), self.token.as_bytes())
    }

    async fn forward(&self, r: &FileOpRequest) -> Result<Value, WireError> {
        if r.request_id.is_empty() || r.request_id.len() > MAX_REQUEST_ID_BYTES {
            return Err(wire(
                codes::INVALID_ARGUMENTS,
                format!("request_id must be 1 to {MAX_REQUEST_ID_BYTES} bytes"),
            ));
        }
        let args: Value = serde_json::from_str(&r.args_json).map_err(|e| {
            wire(
                codes::INVALID_ARGUMENTS,
                format!("args_json is not JSON: {e}"),
            )
        })?;
        // Only file ops: parsed as the agent would, then checked.
        let request: Request = serde_json::from_value(serde_json::json!({
            "id": format!("f-{}", r.request_id),
            "op": r.op,
            "args": args,
        }))
        .ok()
        .filter(|req: &Request| req.op.file_op().is_some())
        .ok_or_else(|| {
            wire(
                codes::UNKNOWN_OP,
                format!("{:?} is not a file operation of the agent", r.op),
            )
        })?;
        let target = self
            .sessions
            .lookup(&r.session)
            .await
            .map_err(|e| wire(codes::AGENT_UNREACHABLE, e))?;
        let not_found = || {
            wire(
                codes::SESSION_NOT_FOUND,
                format!("no session {:?} (unknown, closed or expired)", r.session),
            )
        };
        let target = target.ok_or_else(not_found)?;
        if target.tenant != r.tenant {
            return Err(not_found());
        }
        let pod = target.pod.ok_or_else(|| {
            wire(
                codes::SESSION_NOT_READY,
                format!("session {:?} is not ready: {}", r.session, target.state),
            )
        })?;
        let conn = self.agents.connection(&pod);
        let id = request.id.clone();
        let answer = tokio::time::timeout(
            self.call_timeout,
            conn.call_with(request, |_| {}, self.max_attempts),
        )
        .await;
        let response = match answer {
            Ok(Ok(response)) => response,
            Ok(Err(e)) => return Err(wire(codes::AGENT_UNREACHABLE, e.to_string())),
            Err(_) => {
                return Err(wire(
                    codes::AGENT_UNREACHABLE,
                    format!(
                        "the agent in pod {pod} did not answer within {:?}",
                        self.call_timeout
                    ),
                ));
            }
        };
        // The answer is delivered: the agent may forget it (a background line, not waited).
        tokio::spawn(async move {
            let _ = conn.ack(vec![id]).await;
        });
        match response.body {
            Body::Ok { output } => Ok(output),
            Body::Error(e) => Err(WireError {
                code: e.code.as_str(),
                message: e.message,
                details_json: e.details.map(|d| d.to_string()).unwrap_or_default(),
            }),
            other => Err(wire(
                codes::RELAY_ERROR,
                format!("the agent answered a file op with {other:?}"),
            )),
        }
    }
}

fn wire(code: &str, message: impl Into<String>) -> WireError {
    WireError {
        code: code.to_string(),
        message: message.into(),
        details_json: String::new(),
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[tonic::async_trait]
impl SessionRelay for RelayService {
    async fn file_op(
        &self,
        request: tonic::Request<FileOpRequest>,
    ) -> Result<tonic::Response<FileOpReply>, tonic::Status> {
        if !self.authorized(request.metadata()) {
            tracing::warn!(remote = ?request.remote_addr(), "relay call without a valid token refused");
            return Err(tonic::Status::unauthenticated(
                "a valid relay token is required (authorization: Bearer ...)",
            ));
        }
        let started = Instant::now();
        let r = request.into_inner();
        let outcome = self.forward(&r).await;
        let code = outcome.as_ref().err().map_or("OK", |e| e.code.as_str());
        tracing::info!(
            session = %r.session,
            tenant = %r.tenant,
            op = %r.op,
            request_id = %r.request_id,
            outcome = code,
            duration_ms = started.elapsed().as_millis() as u64,
            "session file op"
        );
        let outcome = match outcome {
            Ok(v) => file_op_reply::Outcome::ResultJson(v.to_string()),
            Err(e) => file_op_reply::Outcome::Error(e),
        };
        Ok(tonic::Response::new(FileOpReply {
            outcome: Some(outcome),
        }))
    }
}

/// Serves `service` on `listener` until `stop`.
pub async fn serve(
    listener: tokio::net::TcpListener,
    service: RelayService,
    stop: CancellationToken,
) -> Result<(), tonic::transport::Error> {
    tonic::transport::Server::builder()
        .add_service(service.into_server())
        .serve_with_incoming_shutdown(
            tokio_stream::wrappers::TcpListenerStream::new(listener),
            stop.cancelled_owned(),
        )
        .await
}

/// Starts the relay of the operator: the token read, the listener bound, the ToolSession
/// cache and the attach pool made; runs until `stop`. Returns the bound address.
pub async fn start(
    client: kube::Client,
    namespace: &str,
    config: &RelayServerConfig,
    pool: Pool,
    stop: CancellationToken,
) -> Result<SocketAddr, String> {
    let token = config.read_token()?;
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|e| format!("binding the relay listener {}: {e}", config.listen))?;
    let addr = listener
        .local_addr()
        .map_err(|e| format!("relay listener: {e}"))?;
    let sessions = KubeSessions::start(client, namespace, stop.clone());
    let service = RelayService::new(
        token,
        Arc::new(sessions),
        Arc::new(pool),
        config.call_timeout,
    );
    tokio::spawn(async move {
        if let Err(e) = serve(listener, service, stop).await {
            tracing::error!(error = %e, "the session relay stopped");
        }
    });
    tracing::info!(%addr, namespace, "session relay listening");
    Ok(addr)
}

/// The pool of agent connections for session pods of `namespace` (container
/// [`AGENT_CONTAINER`]).
pub fn session_pool(client: kube::Client, namespace: &str) -> Pool {
    Pool::new(Api::<Pod>::namespaced(client, namespace), AGENT_CONTAINER)
}

/// Sessions from a table: for tests and tools that drive local agents (no cluster).
#[derive(Default)]
pub struct TableSessions {
    table: std::sync::Mutex<std::collections::HashMap<String, SessionTarget>>,
}

impl TableSessions {
    /// Sets (or replaces) session `name`.
    pub fn set(&self, name: &str, target: SessionTarget) {
        self.table
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(name.to_string(), target);
    }

    /// Removes session `name`.
    pub fn remove(&self, name: &str) {
        self.table
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(name);
    }
}

impl Sessions for TableSessions {
    fn lookup(&self, name: &str) -> Lookup<'_> {
        let found = self
            .table
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(name)
            .cloned();
        Box::pin(async move { Ok(found) })
    }
}

/// Agent connections from a table (pod name -> connection): for local agents.
#[derive(Default)]
pub struct TableAgents {
    table: std::sync::Mutex<std::collections::HashMap<String, Connection>>,
}

impl TableAgents {
    /// Sets the connection of `pod`.
    pub fn set(&self, pod: &str, conn: Connection) {
        self.table
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(pod.to_string(), conn);
    }
}

impl Agents for TableAgents {
    fn connection(&self, pod: &str) -> Connection {
        let found = self
            .table
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(pod)
            .cloned();
        // An unknown pod: a connection that cannot open, so the call ends unreachable.
        found.unwrap_or_else(|| {
            let name = pod.to_string();
            Connection::lazy(
                pod,
                Arc::new(move || {
                    let pod = name.clone();
                    Box::pin(async move {
                        Err(crate::relay::RelayError::Unreachable {
                            pod,
                            attempts: 1,
                            last: "no such pod".into(),
                        })
                    })
                }),
            )
        })
    }
}
