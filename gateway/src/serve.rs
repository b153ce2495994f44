//! `toolrun serve`: the gRPC gateway, the HTTP listener (MCP) and the admin port, with
//! graceful shutdown.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::FutureExt;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_stream::StreamExt;
use tokio_util::sync::CancellationToken;
use tonic::transport::server::TcpIncoming;
use toolrun_proto::v1 as pb;

use crate::admin::{self, AdminState};
use crate::approval::Approvals;
use crate::auth::tls::{Door, ServerTls, TlsError, TlsListener};
use crate::auth::{Auth, ClientAuth, GrpcAuthLayer};
use crate::config::{BackendKind, Config, ConfigError, DEFAULT_KUBERNETES_CONCURRENT_RUNS};
use crate::exec::Executor;
use crate::grpc::ToolService;
use crate::metrics::Metrics;
use crate::registry::RegistryError;
use crate::sandbox::kubernetes::{KubeMetrics, StartError as KubeStartError};
use crate::sandbox::{KubernetesSandbox, Sandbox, SandboxError};
use crate::session::volume::VolumeKind;
use crate::session::{SessionError, SessionManager};
use crate::tools::custom::BuildContext;
use crate::tools::custom_reload::{CustomTools, Source, follow_config_file};
use crate::tools::{
    SANDBOXED_TOOLS, SESSION_TOOLS, builtin_registry, inline_with_files, run_code::SandboxPool,
};

/// Settings of `toolrun serve`.
#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// gRPC listen address (ToolService, grpc.health.v1, reflection).
    #[arg(long, env = "TOOLRUN_LISTEN", default_value = "127.0.0.1:50051")]
    pub listen: SocketAddr,
    /// Admin HTTP listen address (/healthz, /readyz, /metrics).
    #[arg(long, env = "TOOLRUN_ADMIN_LISTEN", default_value = "127.0.0.1:9090")]
    pub admin_listen: SocketAddr,
    /// HTTP listen address of MCP (Streamable HTTP at /mcp), or `off`.
    #[arg(long, env = "TOOLRUN_MCP_LISTEN", default_value = "127.0.0.1:8080", value_parser = parse_listen)]
    pub mcp_listen: Listen,
    /// Configuration file (YAML); see `toolrun.example.yaml`.
    #[arg(long, env = "TOOLRUN_CONFIG")]
    pub config: Option<PathBuf>,
    /// Largest gRPC message accepted or sent, in bytes.
    #[arg(long, env = "TOOLRUN_MAX_MESSAGE_BYTES", default_value_t = 4 * 1024 * 1024)]
    pub max_message_bytes: usize,
    /// Concurrent HTTP/2 streams per connection.
    #[arg(long, env = "TOOLRUN_MAX_CONCURRENT_STREAMS", default_value_t = 1024)]
    pub max_concurrent_streams: u32,
    /// gRPC requests open at once over all connections (calls in flight and streams held
    /// open; health checks not counted); one more is refused with RESOURCE_EXHAUSTED.
    #[arg(long, env = "TOOLRUN_MAX_OPEN_RPCS", default_value_t = crate::inflight::DEFAULT_MAX_OPEN_RPCS)]
    pub max_open_rpcs: usize,
    /// HTTP requests (MCP, provider endpoint) open at once over all connections, from the
    /// first byte received to the last sent; one more is answered 429 with Retry-After.
    #[arg(long, env = "TOOLRUN_MAX_OPEN_HTTP_REQUESTS", default_value_t = crate::inflight::DEFAULT_MAX_OPEN_HTTP_REQUESTS)]
    pub max_open_http_requests: usize,
    /// On SIGTERM, how long in-flight calls may finish before their sandboxes are killed (ms).
    #[arg(long, env = "TOOLRUN_DRAIN_TIMEOUT_MS", default_value_t = 10_000)]
    pub drain_timeout_ms: u64,
    /// Serve only the inline tools, without starting a sandbox backend.
    #[arg(long, env = "TOOLRUN_NO_SANDBOX")]
    pub no_sandbox: bool,
    /// Where sandboxed code runs (overrides `sandbox.backend`): `local` (this machine) or
    /// `kubernetes` (a ToolRun per call, run by the toolrun operator).
    #[arg(long, env = "TOOLRUN_BACKEND", value_enum)]
    pub backend: Option<BackendKind>,
    /// Namespace of the kubernetes backend's ToolRuns (overrides
    /// `sandbox.kubernetes.namespace`; default toolrun-sandbox).
    #[arg(long, env = "TOOLRUN_NAMESPACE")]
    pub namespace: Option<String>,
    /// Where sessions keep their workspaces and records across restarts (one gateway per
    /// directory). Unset (only in embedded use): a private temporary directory.
    #[arg(long, env = "TOOLRUN_STATE_DIR", default_value = "/var/lib/toolrun")]
    pub state_dir: Option<PathBuf>,
    /// API keys file (overrides `auth.keys_file`; made by `toolrun keys create`): every
    /// gRPC, MCP and HTTP request then needs `authorization: Bearer <key>`.
    #[arg(long, env = "TOOLRUN_API_KEYS")]
    pub api_keys: Option<PathBuf>,
    /// Serve without authentication on a non-loopback address (anyone who reaches the
    /// port runs code). Without keys, only loopback listeners are allowed otherwise.
    #[arg(long, env = "TOOLRUN_INSECURE_NO_AUTH")]
    pub insecure_no_auth: bool,
    /// Server certificate chain, PEM (overrides `tls.cert_file`; with `--tls-key`): the
    /// gRPC and HTTP listeners then speak TLS only. Reloaded when the file changes.
    #[arg(long, env = "TOOLRUN_TLS_SERVER_CERT")]
    pub tls_cert: Option<PathBuf>,
    /// Private key of `--tls-cert`, PEM (overrides `tls.key_file`).
    #[arg(long, env = "TOOLRUN_TLS_SERVER_KEY")]
    pub tls_key: Option<PathBuf>,
    /// CA certificates, PEM, that client certificates must chain to (overrides
    /// `tls.client_ca_file`): mutual TLS, a certificate mapped by a tenant's `client_certs`
    /// authenticates as that tenant.
    #[arg(long, env = "TOOLRUN_TLS_CLIENT_CA")]
    pub tls_client_ca: Option<PathBuf>,
    /// With `--tls-client-ca`: whether every connection must present a client certificate
    /// (overrides `tls.client_auth`; default required).
    #[arg(long, env = "TOOLRUN_TLS_CLIENT_AUTH", value_enum)]
    pub tls_client_auth: Option<ClientAuth>,
    /// Also append every call's audit event to this JSON-lines file (overrides
    /// `audit.file`; rotated at `audit.max_file_bytes`; `toolrun replay FILE` re-runs it).
    #[arg(long, env = "TOOLRUN_AUDIT_FILE")]
    pub audit_file: Option<PathBuf>,
}

impl Default for ServeArgs {
    fn default() -> Self {
        ServeArgs {
            listen: "127.0.0.1:50051".parse().expect("valid"),
            admin_listen: "127.0.0.1:9090".parse().expect("valid"),
            // Embedded gateways (tests) open no MCP port unless asked.
            mcp_listen: Listen::Off,
            config: None,
            max_message_bytes: 4 * 1024 * 1024,
            max_concurrent_streams: 1024,
            max_open_rpcs: crate::inflight::DEFAULT_MAX_OPEN_RPCS,
            max_open_http_requests: crate::inflight::DEFAULT_MAX_OPEN_HTTP_REQUESTS,
            drain_timeout_ms: 10_000,
            no_sandbox: false,
            backend: None,
            namespace: None,
            state_dir: None,
            api_keys: None,
            insecure_no_auth: false,
            audit_file: None,
            tls_cert: None,
            tls_key: None,
            tls_client_ca: None,
            tls_client_auth: None,
        }
    }
}

/// A listener that can be turned off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listen {
    /// Not served.
    Off,
    /// Served on this address.
    On(SocketAddr),
}

fn parse_listen(s: &str) -> Result<Listen, String> {
    if s.eq_ignore_ascii_case("off") {
        return Ok(Listen::Off);
    }
    s.parse()
        .map(Listen::On)
        .map_err(|e| format!("{s:?} is neither an address (HOST:PORT) nor `off`: {e}"))
}

/// Why the server could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// Bad configuration.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The tool registry could not be built.
    #[error(transparent)]
    Registry(#[from] RegistryError),
    /// The sandbox backend could not start.
    #[error("sandbox backend: {0}")]
    Sandbox(#[from] SandboxError),
    /// The kubernetes backend could not start (cluster, CRD, RBAC, namespace).
    #[error("kubernetes backend: {0}")]
    Kubernetes(#[from] KubeStartError),
    /// A listener could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The gRPC server failed.
    #[error("gRPC server: {0}")]
    Transport(#[from] tonic::transport::Error),
    /// The admin server failed.
    #[error("admin server: {0}")]
    Admin(std::io::Error),
    /// The HTTP (MCP) server failed.
    #[error("MCP server: {0}")]
    Http(std::io::Error),
    /// The state dir or the sessions in it could not be opened.
    #[error("sessions: {0}")]
    Sessions(#[from] crate::session::SessionError),
    /// The audit file could not be opened.
    #[error("{0}")]
    Audit(std::io::Error),
    /// The API keys file could not be loaded.
    #[error("authentication: {0}")]
    Keys(#[from] crate::auth::keys::KeysError),
    /// The TLS certificate, key or client CA could not be loaded.
    #[error("{0}")]
    Tls(#[from] TlsError),
    /// A non-loopback listener without authentication.
    #[error(
        "refusing to serve without authentication on {addr} (not a loopback address): anyone \
         who reaches it could run code. Give API keys (--api-keys FILE or auth.keys_file; make \
         one with `toolrun keys create --tenant NAME --file FILE`) or client certificates \
         (--tls-cert, --tls-key, --tls-client-ca), listen on 127.0.0.1, or pass \
         --insecure-no-auth if something in front authenticates callers"
    )]
    Insecure {
        /// The listener.
        addr: SocketAddr,
    },
}

/// A running gateway.
pub struct Running {
    /// Bound gRPC address.
    pub grpc_addr: SocketAddr,
    /// Bound admin address.
    pub admin_addr: SocketAddr,
    /// Bound HTTP (MCP) address, when served.
    pub mcp_addr: Option<SocketAddr>,
    shutdown: CancellationToken,
    join: JoinHandle<Result<(), ServeError>>,
}

impl Running {
    /// Begins graceful shutdown.
    pub fn shutdown(&self) {
        self.shutdown.cancel();
    }

    /// A token that begins graceful shutdown when cancelled.
    pub fn shutdown_token(&self) -> CancellationToken {
        self.shutdown.clone()
    }

    /// Waits until the server has stopped.
    pub async fn wait(self) -> Result<(), ServeError> {
        match self.join.await {
            Ok(r) => r,
            Err(e) => Err(ServeError::Admin(std::io::Error::other(e))),
        }
    }
}

/// The session manager of the kubernetes backend: ToolSessions in the sandbox namespace,
/// files through the operator's relay, open sessions restored.
async fn open_kube_sessions(config: &Config) -> Result<Arc<SessionManager>, ServeError> {
    let k = &config.sandbox.kubernetes;
    let relay = k
        .session_relay
        .as_ref()
        .expect("called only with a session relay configured");
    let storage = |m: String| ServeError::Sessions(SessionError::Storage(m));
    let token = std::fs::read_to_string(&relay.token_file).map_err(|e| {
        storage(format!(
            "sandbox.kubernetes.sessionRelay.tokenFile {}: {e}",
            relay.token_file.display()
        ))
    })?;
    let client = crate::sandbox::kubernetes::startup::client()
        .await
        .map_err(|e| storage(format!("sessions on kubernetes: {e}")))?;
    // The chart hands the relay's ClusterIP over in TOOLRUN_SESSION_RELAY_ADDRESS (from the
    // Service's environment variables): it works without cluster DNS. Unexpanded (the
    // Service did not exist when the pod was made): the configured address.
    let address = match std::env::var("TOOLRUN_SESSION_RELAY_ADDRESS") {
        Ok(a) if !a.trim().is_empty() && !a.contains("$(") => a,
        _ => relay.address.clone(),
    };
    tracing::info!(%address, "session relay");
    let relay_client = crate::session::files::RelayClient::new(
        &address,
        &token,
        Duration::from_secs(relay.timeout_seconds),
    )
    .map_err(storage)?;
    let kube = crate::session::kube::KubeSessions::new(
        client,
        &k.namespace,
        relay_client,
        Duration::from_secs(k.start_timeout_seconds),
        k.runtime_class_name.clone(),
        k.session_storage_class_name.clone(),
    );
    Ok(
        SessionManager::open_kube(config.sessions.clone(), Arc::new(Approvals::new()), kube)
            .await?,
    )
}

/// Builds the sandbox backend named by the configuration (for kubernetes: connects and
/// checks the cluster first).
pub async fn build_sandbox(
    config: &Config,
    metrics: &Metrics,
) -> Result<Arc<dyn Sandbox>, ServeError> {
    match config.sandbox.backend {
        BackendKind::Local => Ok(Arc::new(crate::sandbox::local::LocalSandbox::new(
            &config.sandbox,
        )?)),
        BackendKind::Kubernetes => Ok(Arc::new(
            KubernetesSandbox::connect(
                &config.sandbox.kubernetes,
                KubeMetrics::from_metrics(metrics),
            )
            .await?,
        )),
    }
}

/// The configuration file (or the defaults) with the command-line overrides applied.
pub fn effective_config(args: &ServeArgs) -> Result<Config, ConfigError> {
    let mut config = match &args.config {
        Some(path) => Config::load(path)?,
        None => Config::default(),
    };
    if let Some(backend) = args.backend {
        config.sandbox.backend = backend;
    }
    if let Some(ns) = &args.namespace {
        config.sandbox.kubernetes.namespace = ns.clone();
    }
    if let Some(keys) = &args.api_keys {
        config.auth.keys_file = Some(keys.clone());
    }
    if let Some(file) = &args.audit_file {
        config.audit.file = Some(file.clone());
    }
    if let Some(cert) = &args.tls_cert {
        config.tls.cert_file = Some(cert.clone());
    }
    if let Some(key) = &args.tls_key {
        config.tls.key_file = Some(key.clone());
    }
    if let Some(ca) = &args.tls_client_ca {
        config.tls.client_ca_file = Some(ca.clone());
    }
    if let Some(mode) = args.tls_client_auth {
        config.tls.client_auth = mode;
    }
    if config.sandbox.backend == BackendKind::Kubernetes
        && config.sandbox.max_concurrent_runs.is_none()
    {
        config.sandbox.max_concurrent_runs = Some(DEFAULT_KUBERNETES_CONCURRENT_RUNS);
    }
    config.validate()?;
    config
        .auth
        .apply_front_door_bounds(args.max_open_rpcs, args.max_open_http_requests)?;
    Ok(config)
}

/// The authenticator: keys and client certificates (mutual TLS: a listener that verifies
/// them refuses every caller without a mapped certificate or a key) when configured;
/// without either, the safe default: only loopback listeners (gRPC and MCP) unless
/// `--insecure-no-auth`.
pub fn build_auth(args: &ServeArgs, config: &Config) -> Result<Arc<Auth>, ServeError> {
    if config.auth.keys_file.is_some() || config.tls.mutual() {
        return Ok(Auth::from_config(config)?);
    }
    let exposed = std::iter::once(args.listen)
        .chain(match args.mcp_listen {
            Listen::On(a) => Some(a),
            Listen::Off => None,
        })
        .find(|a| !a.ip().is_loopback());
    match exposed {
        Some(addr) if !args.insecure_no_auth => Err(ServeError::Insecure { addr }),
        Some(addr) => {
            tracing::warn!(%addr, "--insecure-no-auth: serving WITHOUT authentication on a non-loopback address");
            Ok(Auth::disabled())
        }
        None => {
            tracing::info!("no API keys: serving without authentication (loopback only)");
            Ok(Auth::disabled())
        }
    }
}

/// Builds everything and starts serving; returns once both listeners are bound.
pub async fn start(args: ServeArgs) -> Result<Running, ServeError> {
    let config = effective_config(&args)?;
    let auth = build_auth(&args, &config)?;
    let tls = ServerTls::load(&config.tls)?;
    let audit = crate::audit::AuditSink::open(&config.audit).map_err(ServeError::Audit)?;
    let metrics = Arc::new(Metrics::new());
    let mut start_allowance = Duration::ZERO;
    // Kubernetes serves sessions when the operator's session relay is configured.
    let kube_sessions = config.sandbox.backend == BackendKind::Kubernetes
        && config.sandbox.kubernetes.session_relay.is_some()
        && !args.no_sandbox;
    let serve_sessions = config.sandbox.backend == BackendKind::Local || kube_sessions;
    let languages = Arc::new(std::sync::Mutex::new(serde_json::json!({"probing": true})));
    let (registry, sandbox_info, pool) = if args.no_sandbox {
        tracing::warn!("--no-sandbox: run_code, code_executor and shell are not served");
        *languages.lock().unwrap_or_else(|e| e.into_inner()) = serde_json::Value::Null;
        let registry = inline_with_files(&config, serve_sessions)?;
        let mut known = SANDBOXED_TOOLS.to_vec();
        known.extend(SESSION_TOOLS);
        registry.check_config(&config, &known)?;
        (registry, None, None)
    } else {
        let sandbox = build_sandbox(&config, &metrics).await?;
        // Each backend logs its own mechanisms, active or not, when it starts.
        let info = sandbox.info();
        start_allowance = sandbox.start_allowance();
        let pool = Arc::new(SandboxPool::new(
            sandbox,
            config.sandbox.clone(),
            metrics.clone(),
        ));
        // /readyz's languages: one short run per language through the sandbox, once.
        if config.sandbox.backend == BackendKind::Local {
            let (pool, languages) = (pool.clone(), languages.clone());
            tokio::spawn(async move {
                let found = pool.probe_languages().await;
                *languages.lock().unwrap_or_else(|e| e.into_inner()) = found;
            });
        } else {
            *languages.lock().unwrap_or_else(|e| e.into_inner()) = serde_json::json!({"probed": false, "why": "not probed on the kubernetes backend (each run is a pod)"});
        }
        let registry = builtin_registry(&config, pool.clone(), serve_sessions)?;
        (registry, Some(info), Some(pool))
    };
    // Sessions: locally their workspaces live in the state dir; on kubernetes each is a
    // ToolSession (an agent pod), its files reached through the operator's relay.
    let sessions = if kube_sessions {
        Some(open_kube_sessions(&config).await?)
    } else if serve_sessions {
        let sessions = SessionManager::open(
            args.state_dir.as_deref(),
            config.sessions.clone(),
            Arc::new(Approvals::new()),
        )?;
        if sessions.volume_kind().0 == VolumeKind::Directory
            && config.sandbox.require_full_isolation
            && !args.no_sandbox
        {
            return Err(ServeError::Sessions(SessionError::Storage(format!(
                "workspaces cannot be size-capped filesystems here ({}); run as root with \
                 mkfs.ext4 and loop devices, or set sandbox.require_full_isolation: false",
                sessions.volume_kind().1.unwrap_or_default()
            ))));
        }
        Some(sessions)
    } else {
        tracing::info!(
            "sessions are not served: the kubernetes backend needs \
             sandbox.kubernetes.sessionRelay (the operator's session relay)"
        );
        None
    };
    let registry = Arc::new(registry);
    for e in registry.all() {
        tracing::info!(
            tool = e.id(),
            enabled = e.enabled,
            disabled_reason = e.disabled_reason.as_deref().unwrap_or(""),
            timeout_ms = e.timeout.as_millis() as u64,
            "tool registered"
        );
    }
    let executor = Arc::new(
        Executor::new(registry.clone(), metrics.clone())
            .with_start_allowance(start_allowance)
            .with_sessions_opt(sessions.clone())
            .with_audit(audit),
    );

    let grpc_listener =
        TcpListener::bind(args.listen)
            .await
            .map_err(|source| ServeError::Bind {
                addr: args.listen,
                source,
            })?;
    let grpc_addr = grpc_listener.local_addr().map_err(ServeError::Admin)?;
    let admin_listener = TcpListener::bind(args.admin_listen)
        .await
        .map_err(|source| ServeError::Bind {
            addr: args.admin_listen,
            source,
        })?;
    let admin_addr = admin_listener.local_addr().map_err(ServeError::Admin)?;
    let http_settings = crate::http::HttpSettings::new(
        &config.mcp,
        args.max_message_bytes,
        args.max_open_http_requests,
    )?;
    let mcp_listener = match args.mcp_listen {
        Listen::Off => None,
        Listen::On(addr) => Some(
            TcpListener::bind(addr)
                .await
                .map_err(|source| ServeError::Bind { addr, source })?,
        ),
    };
    let mcp_addr = match &mcp_listener {
        Some(l) => Some(l.local_addr().map_err(ServeError::Http)?),
        None => None,
    };

    let shutdown = CancellationToken::new();
    let hard_stop = CancellationToken::new();
    // Custom tools: the configuration file's, followed for changes.
    let custom_tools = Arc::new(CustomTools::new(
        executor.clone(),
        registry,
        BuildContext {
            pool,
            sandbox: config.sandbox.clone(),
        },
    ));
    match &args.config {
        Some(path) => {
            follow_config_file(
                custom_tools.clone(),
                path.clone(),
                &config,
                hard_stop.clone(),
            );
        }
        None => {
            custom_tools.set(Source::Config, Vec::new());
        }
    }
    // On Kubernetes, also the `Tool` resources of the sandbox namespace.
    if config.sandbox.backend == BackendKind::Kubernetes && !args.no_sandbox {
        match kube::Client::try_default().await {
            Ok(client) => {
                crate::tools::custom_kube::follow(
                    client,
                    config.sandbox.kubernetes.namespace.clone(),
                    custom_tools.clone(),
                    hard_stop.clone(),
                );
            }
            Err(e) => custom_tools.source_error(Source::Kubernetes, format!("no cluster: {e}")),
        }
    }
    let sandbox_info = sandbox_info.map(|mut info| {
        let Some(sessions) = &sessions else {
            return info;
        };
        if let Some(relay) = &config.sandbox.kubernetes.session_relay
            && kube_sessions
        {
            info.mechanisms.push(crate::sandbox::Mechanism {
                name: "session-pods".into(),
                active: true,
                detail: format!(
                    "each session is a ToolSession in namespace {}: one agent pod made by the \
                     operator, the workspace on its volume; file tools through the operator's \
                     relay at {} (the gateway never attaches to pods)",
                    config.sandbox.kubernetes.namespace, relay.address
                ),
            });
            return info;
        }
        let (kind, problem) = sessions.volume_kind();
        info.mechanisms.push(crate::sandbox::Mechanism {
            name: "workspace-quota".into(),
            active: kind == VolumeKind::Ext4Loop,
            detail: match kind {
                VolumeKind::Ext4Loop => format!(
                    "each session's workspace is a loop-mounted ext4 filesystem of {} MiB and {} files (nosuid, nodev)",
                    config.sessions.workspace_size_mb, config.sessions.workspace_max_files
                ),
                VolumeKind::Directory => problem.unwrap_or_default(),
            },
        });
        info
    });
    if let Some(s) = &sessions {
        s.spawn_reaper(hard_stop.clone());
    }
    auth.spawn_reloader(hard_stop.clone());
    if let Some(tls) = &tls {
        tls.spawn_reloader(hard_stop.clone());
    }
    let admin_state = Arc::new(AdminState {
        ready: false.into(),
        metrics,
        sessions: sessions.clone(),
        sandbox: sandbox_info,
        grpc_addr: grpc_addr.to_string(),
        languages,
        custom_tools: Some(custom_tools),
    });

    let (health, health_service) = tonic_health::server::health_reporter();
    health
        .set_serving::<pb::tool_service_server::ToolServiceServer<ToolService>>()
        .await;
    health
        .set_service_status("", tonic_health::ServingStatus::Serving)
        .await;
    let reflection_v1 = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()
        .expect("descriptor sets are valid");
    let reflection_v1alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1alpha()
        .expect("descriptor sets are valid");
    // Stops the gRPC and HTTP listeners (the drain begins).
    let grpc_stop = CancellationToken::new();
    let mcp = mcp_listener.map(|listener| {
        let router = crate::http::router(
            executor.clone(),
            hard_stop.clone(),
            &http_settings,
            auth.clone(),
        );
        match &tls {
            Some(tls) => {
                let local = listener.local_addr();
                let conns = tls.accept(listener, Door::Http, grpc_stop.clone());
                let listener = TlsListener::new(conns, local.unwrap_or(([0, 0, 0, 0], 0).into()));
                crate::http::serve_tls(listener, router, grpc_stop.clone()).boxed()
            }
            None => crate::http::serve(listener, router, grpc_stop.clone()).boxed(),
        }
    });
    let service = ToolService::new(executor, hard_stop.clone()).into_server(args.max_message_bytes);

    // Graceful shutdown: not ready, health NOT_SERVING, stop accepting, let in-flight calls
    // finish for the drain timeout, then cancel them (which kills their sandboxes).
    {
        let shutdown = shutdown.clone();
        let grpc_stop = grpc_stop.clone();
        let hard_stop = hard_stop.clone();
        let admin_state = admin_state.clone();
        let drain = Duration::from_millis(args.drain_timeout_ms);
        tokio::spawn(async move {
            shutdown.cancelled().await;
            tracing::info!(drain_ms = drain.as_millis() as u64, "shutdown: draining");
            admin_state.ready.store(false, Ordering::Release);
            health
                .set_service_status("", tonic_health::ServingStatus::NotServing)
                .await;
            health
                .set_not_serving::<pb::tool_service_server::ToolServiceServer<ToolService>>()
                .await;
            grpc_stop.cancel();
            tokio::time::sleep(drain).await;
            tracing::warn!("shutdown: drain timeout reached, cancelling remaining calls");
            hard_stop.cancel();
        });
    }

    let grpc_router = tonic::transport::Server::builder()
        .layer(crate::inflight::OpenRpcsLayer::new(args.max_open_rpcs))
        .layer(tower::layer::layer_fn(ZeroDeadline))
        .layer(GrpcAuthLayer(auth))
        .layer(tower::util::MapResponseLayer::new(
            oversize_is_resource_exhausted,
        ))
        .max_concurrent_streams(args.max_concurrent_streams)
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .add_service(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(service);
    let grpc = match &tls {
        Some(tls) => {
            let conns = tls.accept(grpc_listener, Door::Grpc, grpc_stop.clone());
            grpc_router
                .serve_with_incoming_shutdown(
                    tokio_stream::wrappers::ReceiverStream::new(conns)
                        .map(Ok::<_, std::convert::Infallible>),
                    grpc_stop.clone().cancelled_owned(),
                )
                .boxed()
        }
        None => {
            let incoming = TcpIncoming::from(grpc_listener).with_nodelay(Some(true));
            grpc_router
                .serve_with_incoming_shutdown(incoming, grpc_stop.clone().cancelled_owned())
                .boxed()
        }
    };

    let admin_router = admin::router(admin_state.clone());
    let admin_stop = shutdown.clone();
    let admin = axum::serve(admin_listener, admin_router)
        .with_graceful_shutdown(async move { admin_stop.cancelled().await });

    admin_state.ready.store(true, Ordering::Release);
    tracing::info!(grpc = %grpc_addr, admin = %admin_addr, mcp = ?mcp_addr, tls = tls.is_some(), "toolrun serving");
    let mcp = async move {
        match mcp {
            Some(serving) => serving.await,
            None => Ok(()),
        }
    };
    let join = tokio::spawn(async move {
        let (g, a, m) = tokio::join!(grpc, admin, mcp);
        hard_stop.cancel();
        if let Some(s) = sessions {
            s.shutdown().await;
        }
        g?;
        a.map_err(ServeError::Admin)?;
        m.map_err(ServeError::Http)?;
        tracing::info!("toolrun stopped");
        Ok(())
    });
    Ok(Running {
        grpc_addr,
        admin_addr,
        mcp_addr,
        shutdown,
        join,
    })
}

/// Answers a call whose `grpc-timeout` is zero with DEADLINE_EXCEEDED at once. Without it,
/// tonic's own timeout sometimes fires first and answers CANCELLED "Timeout expired"; this
/// layer sits inside that one and is polled first.
#[derive(Debug, Clone)]
struct ZeroDeadline<S>(S);

fn zero_grpc_timeout(headers: &http::HeaderMap) -> bool {
    headers
        .get("grpc-timeout")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.get(..v.len().checked_sub(1)?))
        .and_then(|n| n.parse::<u64>().ok())
        == Some(0)
}

impl<S, ReqB, ResB> tower::Service<http::Request<ReqB>> for ZeroDeadline<S>
where
    S: tower::Service<http::Request<ReqB>, Response = http::Response<ResB>>,
    ResB: Default,
{
    type Response = http::Response<ResB>;
    type Error = S::Error;
    type Future = futures::future::Either<
        futures::future::Ready<Result<http::Response<ResB>, S::Error>>,
        S::Future,
    >;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<ReqB>) -> Self::Future {
        if zero_grpc_timeout(req.headers()) {
            let status =
                tonic::Status::deadline_exceeded("the call's deadline had already expired");
            return futures::future::Either::Left(futures::future::ready(Ok(status.into_http())));
        }
        futures::future::Either::Right(self.0.call(req))
    }
}

/// tonic answers a message over the size limit with OUT_OF_RANGE; the gRPC spec (and our
/// contract) says RESOURCE_EXHAUSTED, which clients treat as "too big, do not retry as is".
fn oversize_is_resource_exhausted<B>(mut resp: http::Response<B>) -> http::Response<B> {
    let headers = resp.headers_mut();
    let out_of_range = headers.get("grpc-status").is_some_and(|v| v == "11");
    let too_large = headers
        .get("grpc-message")
        .and_then(|m| m.to_str().ok())
        .is_some_and(|m| m.contains("length%20too%20large") || m.contains("length too large"));
    if out_of_range && too_large {
        headers.insert("grpc-status", http::HeaderValue::from_static("8"));
    }
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_override_the_file_and_kubernetes_runs_more_at_once() {
        let f = std::env::temp_dir().join(format!("toolrun-serve-{}.yaml", std::process::id()));
        std::fs::write(
            &f,
            "sandbox:\n  backend: local\n  kubernetes:\n    namespace: from-file\n",
        )
        .unwrap();
        let args = |backend, namespace: Option<&str>| ServeArgs {
            config: Some(f.clone()),
            backend,
            namespace: namespace.map(Into::into),
            ..ServeArgs::default()
        };
        let c = effective_config(&args(None, None)).unwrap();
        assert_eq!(c.sandbox.backend, BackendKind::Local);
        assert_eq!(c.sandbox.kubernetes.namespace, "from-file");
        assert_eq!(c.sandbox.max_concurrent_runs, None);
        let c = effective_config(&args(Some(BackendKind::Kubernetes), Some("from-flag"))).unwrap();
        assert_eq!(c.sandbox.backend, BackendKind::Kubernetes);
        assert_eq!(c.sandbox.kubernetes.namespace, "from-flag");
        assert_eq!(
            c.sandbox.max_concurrent_runs,
            Some(DEFAULT_KUBERNETES_CONCURRENT_RUNS)
        );
        let err = effective_config(&args(
            Some(BackendKind::Kubernetes),
            Some("Not_A_Namespace"),
        ))
        .unwrap_err();
        assert!(
            err.to_string().contains("sandbox.kubernetes.namespace"),
            "{err}"
        );
        std::fs::remove_file(&f).unwrap();
    }
}
