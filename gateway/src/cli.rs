//! The `toolrun` command line: `serve`, `tools`, `call`, `run`, `session`, `approvals`,
//! `approve`, `deny`, `bench`.
//!
//! Exit codes: 0 success; 1 the tool ran and failed (`ok = false`); 2 bad usage;
//! 3 the gateway could not be reached or the RPC failed.

use std::io::{Read, Write};
use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};
use serde_json::{Value, json};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;
use toolrun_proto::v1 as pb;
use toolrun_proto::v1::tool_service_client::ToolServiceClient;

use crate::grpc::error_code_name;
use crate::serve::ServeArgs;

/// Exit code: the tool failed.
pub const EXIT_TOOL_FAILED: i32 = 1;
/// Exit code: bad usage.
pub const EXIT_USAGE: i32 = 2;
/// Exit code: the gateway could not be reached or the RPC failed.
pub const EXIT_CONNECTION: i32 = 3;

/// toolrun: run AI agents' tool calls, untrusted code in a sandbox.
#[derive(Debug, Parser)]
#[command(name = "toolrun", version, about, propagate_version = true)]
pub struct Cli {
    /// Log format.
    #[arg(long, env = "TOOLRUN_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text, global = true)]
    pub log_format: LogFormat,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Start the gateway (gRPC + admin HTTP) with the local sandbox.
    Serve(ServeArgs),
    /// List the gateway's tools.
    Tools {
        #[command(flatten)]
        conn: Conn,
        /// Output form.
        #[arg(long, value_enum, default_value_t = ToolsFormat::Table)]
        format: ToolsFormat,
        /// Also list disabled tools, with why.
        #[arg(long)]
        all: bool,
    },
    /// Call one tool and print its result as JSON; with --from, run the tool calls in a
    /// provider's assistant message and print that provider's tool-result message(s).
    Call {
        #[command(flatten)]
        conn: Conn,
        /// Tool id, e.g. calculator; with --from, the message's file ('-' for stdin).
        tool: String,
        /// Arguments as a JSON object, e.g. '{"expression":"2+2"}' (default {}).
        #[arg(default_value = "{}")]
        arguments: String,
        /// Upper bound for the call in ms (0 = the tool's timeout).
        #[arg(long, default_value_t = 0)]
        timeout_ms: u32,
        /// Call id to send (default: the gateway makes one).
        #[arg(long, default_value = "")]
        call_id: String,
        /// Run in this session (its workspace, its approvals).
        #[arg(long, default_value = "")]
        session: String,
        /// Read the calls from an assistant message (or API response) in this provider's
        /// format.
        #[arg(long, value_enum, value_name = "PROVIDER")]
        from: Option<crate::providers::Provider>,
    },
    /// Run code in the sandbox, streaming its output as it comes.
    Run {
        #[command(flatten)]
        conn: Conn,
        /// Language of the program.
        #[arg(long, short, value_enum)]
        language: RunLanguage,
        /// The program as text.
        #[arg(short = 'c', long = "code", conflicts_with = "file")]
        code: Option<String>,
        /// The program's file ('-' or nothing: read the program from stdin).
        file: Option<PathBuf>,
        /// Wall-clock limit in seconds (default: the gateway's, 10).
        #[arg(long)]
        timeout: Option<u64>,
        /// Program argument (repeatable).
        #[arg(long = "arg")]
        args: Vec<String>,
        /// Environment variable NAME=VALUE (repeatable).
        #[arg(long = "env")]
        env: Vec<String>,
        /// Run in this session's workspace.
        #[arg(long, default_value = "")]
        session: String,
    },
    /// Create, list, show or close sessions.
    Session {
        #[command(flatten)]
        conn: Conn,
        /// What to do.
        #[command(subcommand)]
        action: SessionAction,
    },
    /// List the calls waiting for approval (with --watch: as they come).
    Approvals {
        #[command(flatten)]
        conn: Conn,
        /// Only this session's.
        #[arg(long, default_value = "")]
        session: String,
        /// Keep watching and print each new approval as it is asked.
        #[arg(long)]
        watch: bool,
        /// Print JSON lines instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Approve a waiting call, optionally with modified arguments.
    Approve {
        #[command(flatten)]
        conn: Conn,
        /// The approval's id (from `toolrun approvals`).
        approval_id: String,
        /// Run the call with these arguments instead (a JSON object).
        #[arg(long = "args")]
        args: Option<String>,
        /// A note for the model.
        #[arg(long, default_value = "")]
        message: String,
    },
    /// Deny a waiting call; the model gets APPROVAL_DENIED with the message.
    Deny {
        #[command(flatten)]
        conn: Conn,
        /// The approval's id (from `toolrun approvals`).
        approval_id: String,
        /// Why, for the model.
        #[arg(long)]
        message: String,
    },
    /// Load-generate against a gateway and report latency and throughput.
    Bench(crate::bench::BenchArgs),
    /// Re-run the recorded calls of deterministic tools in an audit file (`toolrun serve
    /// --audit-file`) and report any whose verdict or output hash differs; exit 1 if any.
    Replay {
        /// The audit file (JSON lines).
        file: PathBuf,
        /// The configuration the calls ran with (tool settings).
        #[arg(long, env = "TOOLRUN_CONFIG")]
        config: Option<PathBuf>,
    },
    /// Make, list or revoke API keys in a keys file (`toolrun serve --api-keys FILE`; a
    /// running gateway picks the change up within `auth.reload_interval_seconds`).
    Keys {
        /// What to do.
        #[command(subcommand)]
        action: KeysAction,
    },
}

/// `toolrun keys ...`.
#[derive(Debug, Subcommand)]
pub enum KeysAction {
    /// Make a key for a tenant: prints it once (only its hash is stored).
    Create {
        /// The keys file (created if missing).
        #[arg(long, env = "TOOLRUN_API_KEYS")]
        file: PathBuf,
        /// The tenant the key authenticates as.
        #[arg(long)]
        tenant: String,
        /// A label for the key (who holds it), to revoke it by.
        #[arg(long)]
        name: Option<String>,
    },
    /// List the keys (tenant, name, hash prefix, creation time).
    List {
        /// The keys file.
        #[arg(long, env = "TOOLRUN_API_KEYS")]
        file: PathBuf,
    },
    /// Revoke keys by name, or by hash prefix (at least 8 hex digits).
    Revoke {
        /// The keys file.
        #[arg(long, env = "TOOLRUN_API_KEYS")]
        file: PathBuf,
        /// The key's name or hash prefix.
        which: String,
    },
}

/// `toolrun replay`: prints one line per record and a summary; the exit code.
async fn replay(file: &std::path::Path, config: Option<&std::path::Path>) -> i32 {
    let config = match config.map(crate::config::Config::load).transpose() {
        Ok(c) => c.unwrap_or_default(),
        Err(e) => {
            eprintln!("toolrun replay: {e}");
            return EXIT_USAGE;
        }
    };
    match crate::audit::replay(file, &config, &mut std::io::stdout()).await {
        Ok(s) => {
            println!(
                "replay: {} replayed ({} same, {} differ), {} listed, not replayed",
                s.same + s.differ,
                s.same,
                s.differ,
                s.skipped
            );
            if s.differ > 0 { EXIT_TOOL_FAILED } else { 0 }
        }
        Err(e) => {
            eprintln!("toolrun replay: {e}");
            EXIT_USAGE
        }
    }
}

/// Runs `toolrun keys`; returns the exit code.
pub fn keys(action: KeysAction) -> Result<i32, crate::auth::keys::KeysError> {
    use crate::auth::keys;
    match action {
        KeysAction::Create { file, tenant, name } => {
            let key = keys::create(&file, &tenant, name.as_deref())?;
            eprintln!(
                "toolrun: key for tenant {tenant} added to {} (only its hash is stored; this is \
                 the only time the key is shown)",
                file.display()
            );
            println!("{key}");
        }
        KeysAction::List { file } => {
            println!("{:<24} {:<20} {:<18} CREATED", "TENANT", "NAME", "SHA256");
            for k in keys::list(&file)? {
                println!(
                    "{:<24} {:<20} {:<18} {}",
                    k.tenant,
                    k.name.as_deref().unwrap_or("-"),
                    &k.sha256[..16.min(k.sha256.len())],
                    k.created.as_deref().unwrap_or("-")
                );
            }
        }
        KeysAction::Revoke { file, which } => {
            let n = keys::revoke(&file, &which)?;
            if n == 0 {
                eprintln!("toolrun: no key named {which:?} or with that hash prefix");
                return Ok(EXIT_USAGE);
            }
            println!("revoked {n} key(s)");
        }
    }
    Ok(0)
}

/// `toolrun session ...`.
#[derive(Debug, Subcommand)]
pub enum SessionAction {
    /// Create a session; prints its id.
    Create {
        /// The id to use (default: a generated, unguessable one).
        #[arg(long, default_value = "")]
        id: String,
        /// Which calls ask for approval: none (every call asks), safe (read-only tools run,
        /// the rest ask), all (nothing asks). Default: the gateway's (safe).
        #[arg(long, value_enum)]
        approval_mode: Option<ModeArg>,
        /// Expire after this many seconds without a call (default: the gateway's, 1800).
        #[arg(long, default_value_t = 0)]
        idle_timeout: u32,
    },
    /// List the open sessions.
    List,
    /// Show one session.
    Get {
        /// Session id.
        id: String,
    },
    /// Close a session: kill what runs in it, delete its workspace.
    Close {
        /// Session id.
        id: String,
    },
}

/// Approval modes on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ModeArg {
    /// Every call asks.
    None,
    /// Read-only tools run, the rest ask.
    Safe,
    /// Nothing asks.
    All,
}

/// Where the gateway is.
#[derive(Debug, Clone, clap::Args)]
pub struct Conn {
    /// Gateway gRPC address.
    #[arg(
        long,
        env = "TOOLRUN_ADDR",
        default_value = "http://127.0.0.1:50051",
        global = true
    )]
    pub addr: String,
    /// API key, sent as `authorization: Bearer <key>` (prefer the environment variable:
    /// a command line is visible to other users of the machine).
    #[arg(long, env = "TOOLRUN_API_KEY", hide_env_values = true, global = true)]
    pub api_key: Option<String>,
    /// TLS to the gateway.
    #[command(flatten)]
    pub tls: ClientTls,
}

impl Conn {
    /// Connects to the gateway with the key and TLS settings.
    pub async fn connect(&self) -> Result<Client, CliError> {
        connect_with(&self.addr, self.api_key.as_deref(), &self.tls).await
    }
}

/// TLS settings of a client: an `https://` address, or any of these, makes the connection
/// TLS (the CA and the client certificate in PEM files).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ClientTls {
    /// CA certificates (PEM) the gateway's certificate must chain to (default, with an
    /// `https://` address: the Mozilla roots compiled in).
    #[arg(long, env = "TOOLRUN_TLS_CA", global = true)]
    pub tls_ca: Option<PathBuf>,
    /// Client certificate chain (PEM) for a gateway that verifies client certificates
    /// (mutual TLS); with `--tls-key`.
    #[arg(long, env = "TOOLRUN_TLS_CERT", global = true)]
    pub tls_cert: Option<PathBuf>,
    /// Private key (PEM) of `--tls-cert`.
    #[arg(long, env = "TOOLRUN_TLS_KEY", global = true)]
    pub tls_key: Option<PathBuf>,
    /// Name the gateway's certificate must carry (default: the address's host).
    #[arg(long, env = "TOOLRUN_TLS_SERVER_NAME", global = true)]
    pub tls_server_name: Option<String>,
}

impl ClientTls {
    /// Any TLS setting is given.
    pub fn any(&self) -> bool {
        self.tls_ca.is_some()
            || self.tls_cert.is_some()
            || self.tls_key.is_some()
            || self.tls_server_name.is_some()
    }

    /// tonic's client TLS settings.
    pub fn client_config(&self) -> Result<tonic::transport::ClientTlsConfig, CliError> {
        use tonic::transport::{Certificate, ClientTlsConfig, Identity};
        let read = |flag: &str, path: &PathBuf| {
            std::fs::read(path)
                .map_err(|e| CliError::Usage(format!("{flag} {}: {e}", path.display())))
        };
        let mut config = ClientTlsConfig::new();
        config = match &self.tls_ca {
            Some(ca) => config.ca_certificate(Certificate::from_pem(read("--tls-ca", ca)?)),
            None => config.with_webpki_roots(),
        };
        match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => {
                config = config.identity(Identity::from_pem(
                    read("--tls-cert", cert)?,
                    read("--tls-key", key)?,
                ));
            }
            (None, None) => {}
            _ => {
                return Err(CliError::Usage(
                    "--tls-cert and --tls-key go together".into(),
                ));
            }
        }
        if let Some(name) = &self.tls_server_name {
            config = config.domain_name(name.clone());
        }
        Ok(config)
    }
}

/// `toolrun tools --format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ToolsFormat {
    /// A table for people.
    Table,
    /// toolrun's native definitions.
    Json,
    /// OpenAI `tools` entries.
    Openai,
    /// Anthropic `tools` entries.
    Anthropic,
    /// MCP `tools/list` entries.
    Mcp,
    /// OpenAI Responses `tools` entries.
    OpenaiResponses,
    /// Ollama `tools` entries.
    Ollama,
    /// Gemini `functionDeclarations` entries.
    Gemini,
}

/// `toolrun run --language`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum RunLanguage {
    /// Python 3.
    Python,
    /// JavaScript (Node.js).
    Javascript,
    /// Bash.
    Bash,
}

/// Client-side failures.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// Could not connect.
    #[error("cannot connect to the gateway at {addr}: {source}")]
    Connect {
        /// The address.
        addr: String,
        /// Why.
        source: tonic::transport::Error,
    },
    /// The RPC failed.
    #[error("RPC failed: {0}")]
    Rpc(#[from] tonic::Status),
    /// Bad usage.
    #[error("{0}")]
    Usage(String),
    /// Local I/O.
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

impl CliError {
    /// The process exit code for this error.
    pub fn exit_code(&self) -> i32 {
        match self {
            CliError::Usage(_) => EXIT_USAGE,
            CliError::Io(_) => EXIT_USAGE,
            CliError::Connect { .. } | CliError::Rpc(_) => EXIT_CONNECTION,
        }
    }
}

/// Adds the API key to every request.
#[derive(Debug, Clone)]
pub struct ApiKey(Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>);

impl tonic::service::Interceptor for ApiKey {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(v) = &self.0 {
            req.metadata_mut().insert("authorization", v.clone());
        }
        Ok(req)
    }
}

/// A gateway client that sends the API key.
pub type Client = ToolServiceClient<InterceptedService<Channel, ApiKey>>;

/// Connects to the gateway (plain, or TLS for an `https://` address); `api_key` goes with
/// every request.
pub async fn connect(addr: &str, api_key: Option<&str>) -> Result<Client, CliError> {
    connect_with(addr, api_key, &ClientTls::default()).await
}

/// Connects to the gateway with `tls` (an `http://` address with TLS settings is refused:
/// it would send the key in clear).
pub async fn connect_with(
    addr: &str,
    api_key: Option<&str>,
    tls: &ClientTls,
) -> Result<Client, CliError> {
    let key = match api_key.map(str::trim).filter(|k| !k.is_empty()) {
        None => None,
        Some(k) => Some(
            format!("Bearer {k}")
                .parse()
                .map_err(|_| CliError::Usage("the API key is not printable ASCII".into()))?,
        ),
    };
    let https = addr.starts_with("https://");
    if tls.any() && !https {
        return Err(CliError::Usage(format!(
            "--tls-ca, --tls-cert, --tls-key and --tls-server-name need an https:// address, \
             not {addr:?}"
        )));
    }
    let mut endpoint = Channel::from_shared(addr.to_string())
        .map_err(|e| CliError::Usage(format!("bad --addr {addr:?}: {e}")))?
        .tcp_nodelay(true);
    if https {
        endpoint = endpoint
            .tls_config(tls.client_config()?)
            .map_err(|source| CliError::Connect {
                addr: addr.to_string(),
                source,
            })?;
    }
    let channel = endpoint
        .connect()
        .await
        .map_err(|source| CliError::Connect {
            addr: addr.to_string(),
            source,
        })?;
    Ok(ToolServiceClient::with_interceptor(channel, ApiKey(key))
        .max_decoding_message_size(64 * 1024 * 1024)
        .max_encoding_message_size(64 * 1024 * 1024))
}

/// A wire result as JSON for people and scripts (output parsed back into JSON).
pub fn result_json(r: &pb::ToolResult) -> Value {
    let output: Value = if r.output_json.is_empty() {
        Value::Null
    } else {
        serde_json::from_str(&r.output_json).unwrap_or(Value::String(r.output_json.clone()))
    };
    let mut v = json!({
        "call_id": r.call_id,
        "tool": r.tool,
        "ok": r.ok,
        "output": output,
        "output_hash": r.output_hash,
        "duration_us": r.duration_us,
    });
    if let Some(e) = &r.error {
        let details: Value = if e.details_json.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&e.details_json).unwrap_or(Value::Null)
        };
        v["error"] = json!({
            "code": error_code_name(e.code),
            "message": e.message,
            "details": details,
        });
    }
    v
}

/// Runs a client subcommand; returns the exit code.
pub async fn run_client(command: Command) -> Result<i32, CliError> {
    match command {
        Command::Serve(_) | Command::Bench(_) | Command::Keys { .. } | Command::Replay { .. } => {
            unreachable!("handled by the caller")
        }
        Command::Tools { conn, format, all } => tools(&conn, format, all).await,
        Command::Session { conn, action } => session(&conn, action).await,
        Command::Approvals {
            conn,
            session,
            watch,
            json,
        } => approvals(&conn, session, watch, json).await,
        Command::Approve {
            conn,
            approval_id,
            args,
            message,
        } => decide(&conn, approval_id, true, args.unwrap_or_default(), message).await,
        Command::Deny {
            conn,
            approval_id,
            message,
        } => decide(&conn, approval_id, false, String::new(), message).await,
        Command::Call {
            conn,
            tool: file,
            arguments,
            session,
            from: Some(provider),
            ..
        } => call_from(&conn, provider, &file, &arguments, session).await,
        Command::Call {
            conn,
            tool,
            arguments,
            timeout_ms,
            call_id,
            session,
            ..
        } if !session.is_empty() => {
            // In a session a call may wait for approval: stream, to say so while it waits.
            let result = call_streaming(
                &conn,
                pb::CallToolRequest {
                    call_id,
                    tool,
                    arguments_json: arguments,
                    timeout_ms,
                    session_id: session,
                },
            )
            .await?;
            println!(
                "{}",
                serde_json::to_string_pretty(&result_json(&result)).expect("json")
            );
            Ok(if result.ok { 0 } else { EXIT_TOOL_FAILED })
        }
        Command::Call {
            conn,
            tool,
            arguments,
            timeout_ms,
            call_id,
            ..
        } => {
            let mut client = conn.connect().await?;
            let resp = client
                .call_tool(pb::CallToolRequest {
                    call_id,
                    tool,
                    arguments_json: arguments,
                    timeout_ms,
                    session_id: String::new(),
                })
                .await?
                .into_inner();
            let result = resp
                .result
                .ok_or_else(|| tonic::Status::internal("response without a result"))?;
            println!(
                "{}",
                serde_json::to_string_pretty(&result_json(&result)).expect("json")
            );
            Ok(if result.ok { 0 } else { EXIT_TOOL_FAILED })
        }
        Command::Run {
            conn,
            language,
            code,
            file,
            timeout,
            args,
            env,
            session,
        } => {
            let code = match (code, file) {
                (Some(c), _) => c,
                (None, Some(f)) if f.as_os_str() != "-" => std::fs::read_to_string(&f)
                    .map_err(|e| CliError::Usage(format!("cannot read {}: {e}", f.display())))?,
                _ => {
                    let mut s = String::new();
                    std::io::stdin().read_to_string(&mut s)?;
                    s
                }
            };
            let mut env_map = serde_json::Map::new();
            for kv in env {
                let (k, v) = kv
                    .split_once('=')
                    .ok_or_else(|| CliError::Usage(format!("--env {kv:?}: expected NAME=VALUE")))?;
                env_map.insert(k.to_string(), Value::String(v.to_string()));
            }
            let language = match language {
                RunLanguage::Python => "python",
                RunLanguage::Javascript => "javascript",
                RunLanguage::Bash => "bash",
            };
            let mut arguments =
                json!({"language": language, "code": code, "args": args, "env": env_map});
            if let Some(t) = timeout {
                arguments["timeout"] = json!(t);
            }
            run_streaming(&conn, arguments, session).await
        }
    }
}

fn print_approval_notice(a: &pb::Approval) {
    eprintln!(
        "toolrun: waiting for approval {} ({}): approve with `toolrun approve {}` or deny with \
         `toolrun deny {} --message ...`",
        a.approval_id, a.tool, a.approval_id, a.approval_id
    );
}

/// A call through StreamTool, saying on stderr when it waits for approval; returns the result.
async fn call_streaming(conn: &Conn, req: pb::CallToolRequest) -> Result<pb::ToolResult, CliError> {
    let mut client = conn.connect().await?;
    let mut stream = client.stream_tool(req).await?.into_inner();
    while let Some(event) = stream.message().await? {
        match event.event {
            Some(pb::tool_event::Event::Approval(a)) => print_approval_notice(&a),
            Some(pb::tool_event::Event::Result(r)) => return Ok(r),
            _ => {}
        }
    }
    Err(CliError::Rpc(tonic::Status::unavailable(
        "the stream ended without a result",
    )))
}

fn mode_name(m: i32) -> String {
    enum_name(
        pb::ApprovalMode::try_from(m).ok().map(|c| c.as_str_name()),
        "APPROVAL_MODE_",
    )
}

fn ms_to_rfc3339(ms: i64) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms.max(0) as u64);
    humantime::format_rfc3339_seconds(t).to_string()
}

fn session_json(s: &pb::Session) -> Value {
    json!({
        "session_id": s.session_id,
        "approval_mode": mode_name(s.approval_mode),
        "idle_timeout_seconds": s.idle_timeout_seconds,
        "created_at": ms_to_rfc3339(s.created_at_ms),
        "last_used_at": ms_to_rfc3339(s.last_used_at_ms),
        "expires_at": ms_to_rfc3339(s.expires_at_ms),
        "workspace": {
            "path": s.workspace_path,
            "bytes_used": s.workspace_bytes_used,
            "bytes_limit": s.workspace_bytes_limit,
            "files_used": s.workspace_files_used,
            "files_limit": s.workspace_files_limit,
        },
        "calls_running": s.calls_running,
    })
}

async fn session(conn: &Conn, action: SessionAction) -> Result<i32, CliError> {
    let mut client = conn.connect().await?;
    match action {
        SessionAction::Create {
            id,
            approval_mode,
            idle_timeout,
        } => {
            let mode = match approval_mode {
                None => pb::ApprovalMode::Unspecified,
                Some(ModeArg::None) => pb::ApprovalMode::None,
                Some(ModeArg::Safe) => pb::ApprovalMode::Safe,
                Some(ModeArg::All) => pb::ApprovalMode::All,
            };
            let s = client
                .create_session(pb::CreateSessionRequest {
                    session_id: id,
                    approval_mode: mode as i32,
                    idle_timeout_seconds: idle_timeout,
                })
                .await?
                .into_inner();
            println!("{}", s.session_id);
        }
        SessionAction::List => {
            let sessions = client
                .list_sessions(pb::ListSessionsRequest {})
                .await?
                .into_inner()
                .sessions;
            println!(
                "{:<36} {:<5} {:>7} {:>12} {:>8}  EXPIRES",
                "SESSION", "MODE", "CALLS", "USED", "FILES"
            );
            for s in &sessions {
                println!(
                    "{:<36} {:<5} {:>7} {:>10}Ki {:>8}  {}",
                    s.session_id,
                    mode_name(s.approval_mode),
                    s.calls_running,
                    s.workspace_bytes_used / 1024,
                    s.workspace_files_used,
                    ms_to_rfc3339(s.expires_at_ms)
                );
            }
        }
        SessionAction::Get { id } => {
            let s = client
                .get_session(pb::GetSessionRequest { session_id: id })
                .await?
                .into_inner();
            println!(
                "{}",
                serde_json::to_string_pretty(&session_json(&s)).expect("json")
            );
        }
        SessionAction::Close { id } => {
            let r = client
                .close_session(pb::CloseSessionRequest { session_id: id })
                .await?
                .into_inner();
            let id = r.session.map(|s| s.session_id).unwrap_or_default();
            println!(
                "closed {id} ({} running calls cancelled)",
                r.calls_cancelled
            );
        }
    }
    Ok(0)
}

fn approval_json(a: &pb::Approval) -> Value {
    json!({
        "approval_id": a.approval_id,
        "session_id": a.session_id,
        "call_id": a.call_id,
        "tool": a.tool,
        "kind": enum_name(pb::ApprovalKind::try_from(a.kind).ok().map(|c| c.as_str_name()), "APPROVAL_KIND_"),
        "arguments": serde_json::from_str::<Value>(&a.arguments_json).unwrap_or(Value::Null),
        "reason": a.reason,
        "requested_at": ms_to_rfc3339(a.requested_at_ms),
        "expires_at": ms_to_rfc3339(a.expires_at_ms),
    })
}

fn print_approval(a: &pb::Approval, as_json: bool) {
    if as_json {
        println!("{}", approval_json(a));
        return;
    }
    let kind = enum_name(
        pb::ApprovalKind::try_from(a.kind)
            .ok()
            .map(|c| c.as_str_name()),
        "APPROVAL_KIND_",
    );
    println!(
        "{}  {}  {} ({kind})  session {}  expires {}",
        a.approval_id,
        a.tool,
        a.arguments_json,
        a.session_id,
        ms_to_rfc3339(a.expires_at_ms)
    );
    for line in a.reason.lines() {
        println!("    {line}");
    }
}

async fn approvals(
    conn: &Conn,
    session: String,
    watch: bool,
    as_json: bool,
) -> Result<i32, CliError> {
    let mut client = conn.connect().await?;
    if !watch {
        let list = client
            .list_approvals(pb::ListApprovalsRequest {
                session_id: session,
            })
            .await?
            .into_inner()
            .approvals;
        if list.is_empty() && !as_json {
            println!("no approvals pending");
        }
        for a in &list {
            print_approval(a, as_json);
        }
        return Ok(0);
    }
    let mut stream = client
        .watch_approvals(pb::WatchApprovalsRequest {
            session_id: session,
        })
        .await?
        .into_inner();
    while let Some(a) = stream.message().await? {
        print_approval(&a, as_json);
        std::io::stdout().flush()?;
    }
    Ok(0)
}

async fn decide(
    conn: &Conn,
    approval_id: String,
    approve: bool,
    arguments_json: String,
    message: String,
) -> Result<i32, CliError> {
    if !arguments_json.is_empty() {
        let v: Value = serde_json::from_str(&arguments_json)
            .map_err(|e| CliError::Usage(format!("--args is not JSON: {e}")))?;
        if !v.is_object() {
            return Err(CliError::Usage("--args must be a JSON object".into()));
        }
    }
    let mut client = conn.connect().await?;
    let r = client
        .decide_approval(pb::DecideApprovalRequest {
            approval_id,
            approve,
            arguments_json,
            message,
        })
        .await?
        .into_inner();
    let a = r.approval.unwrap_or_default();
    println!(
        "{} {} ({} in session {})",
        if r.approved { "approved" } else { "denied" },
        a.approval_id,
        a.tool,
        a.session_id
    );
    Ok(0)
}

async fn run_streaming(conn: &Conn, arguments: Value, session_id: String) -> Result<i32, CliError> {
    let mut client = conn.connect().await?;
    let mut stream = client
        .stream_tool(pb::CallToolRequest {
            call_id: String::new(),
            tool: "run_code".into(),
            arguments_json: arguments.to_string(),
            timeout_ms: 0,
            session_id,
        })
        .await?
        .into_inner();
    let mut stdout = std::io::stdout();
    let mut stderr = std::io::stderr();
    while let Some(event) = stream.message().await? {
        match event.event {
            Some(pb::tool_event::Event::Stdout(c)) => {
                stdout.write_all(&c.data)?;
                stdout.flush()?;
            }
            Some(pb::tool_event::Event::Stderr(c)) => {
                stderr.write_all(&c.data)?;
                stderr.flush()?;
            }
            Some(pb::tool_event::Event::Approval(a)) => print_approval_notice(&a),
            Some(pb::tool_event::Event::Result(r)) => {
                if r.ok {
                    return Ok(0);
                }
                let out: Value = serde_json::from_str(&r.output_json).unwrap_or(Value::Null);
                let (code, message) = r
                    .error
                    .as_ref()
                    .map(|e| (error_code_name(e.code), e.message.clone()))
                    .unwrap_or_default();
                let mut note = format!("toolrun: {code}: {message}");
                if out["stdout_truncated"] == true || out["stderr_truncated"] == true {
                    note.push_str(" (output truncated)");
                }
                eprintln!("{note}");
                return Ok(EXIT_TOOL_FAILED);
            }
            None => {}
        }
    }
    Err(CliError::Rpc(tonic::Status::unavailable(
        "the stream ended without a result",
    )))
}

/// `toolrun call --from PROVIDER FILE`: prints the provider's result message(s); exit 1
/// when any call failed.
async fn call_from(
    conn: &Conn,
    provider: crate::providers::Provider,
    file: &str,
    arguments: &str,
    session_id: String,
) -> Result<i32, CliError> {
    if arguments != "{}" {
        return Err(CliError::Usage(
            "with --from, give only the message's file (the arguments are in the message)".into(),
        ));
    }
    let message_json = if file == "-" {
        let mut s = String::new();
        std::io::stdin().read_to_string(&mut s)?;
        s
    } else {
        std::fs::read_to_string(file)
            .map_err(|e| CliError::Usage(format!("cannot read {file}: {e}")))?
    };
    let mut client = conn.connect().await?;
    let resp = client
        .call_provider_tools(pb::CallProviderToolsRequest {
            provider: provider.name().into(),
            message_json,
            session_id,
        })
        .await?
        .into_inner();
    let results: Value = serde_json::from_str(&resp.results_json)
        .map_err(|e| tonic::Status::internal(format!("results_json is not JSON: {e}")))?;
    println!("{}", serde_json::to_string_pretty(&results).expect("json"));
    Ok(if resp.results.iter().all(|r| r.ok) {
        0
    } else {
        EXIT_TOOL_FAILED
    })
}

async fn tools(conn: &Conn, format: ToolsFormat, all: bool) -> Result<i32, CliError> {
    let mut client = conn.connect().await?;
    let wire_format = match format {
        ToolsFormat::Table | ToolsFormat::Json => pb::ToolFormat::Unspecified,
        ToolsFormat::Openai => pb::ToolFormat::Openai,
        ToolsFormat::Anthropic => pb::ToolFormat::Anthropic,
        ToolsFormat::Mcp => pb::ToolFormat::Mcp,
        ToolsFormat::OpenaiResponses => pb::ToolFormat::OpenaiResponses,
        ToolsFormat::Ollama => pb::ToolFormat::Ollama,
        ToolsFormat::Gemini => pb::ToolFormat::Gemini,
    };
    let tools = client
        .list_tools(pb::ListToolsRequest {
            format: wire_format as i32,
            include_disabled: all,
        })
        .await?
        .into_inner()
        .tools;
    match format {
        ToolsFormat::Table => {
            println!(
                "{:<16} {:<12} {:<8} {:>10}  DESCRIPTION",
                "ID", "CATEGORY", "SANDBOX", "TIMEOUT"
            );
            for t in &tools {
                let category = pb::Category::try_from(t.category)
                    .map(|c| {
                        c.as_str_name()
                            .trim_start_matches("CATEGORY_")
                            .to_lowercase()
                    })
                    .unwrap_or_default();
                let mut desc = if t.disabled_reason.is_empty() {
                    t.description.clone()
                } else {
                    format!("DISABLED: {}", t.disabled_reason)
                };
                if desc.len() > 70 {
                    let cut = (0..=67)
                        .rev()
                        .find(|i| desc.is_char_boundary(*i))
                        .unwrap_or(0);
                    desc.truncate(cut);
                    desc.push_str("...");
                }
                println!(
                    "{:<16} {:<12} {:<8} {:>8}ms  {}",
                    t.id,
                    category,
                    if t.sandbox_required { "yes" } else { "no" },
                    t.timeout_ms,
                    desc
                );
            }
        }
        ToolsFormat::Json => {
            let defs: Vec<Value> = tools.iter().map(native_json).collect();
            println!("{}", serde_json::to_string_pretty(&defs).expect("json"));
        }
        _ => {
            let defs: Vec<Value> = tools
                .iter()
                .map(|t| serde_json::from_str(&t.rendered_json).unwrap_or(Value::Null))
                .collect();
            println!("{}", serde_json::to_string_pretty(&defs).expect("json"));
        }
    }
    Ok(0)
}

fn enum_name(name: Option<&str>, prefix: &str) -> String {
    name.map(|n| n.trim_start_matches(prefix).to_lowercase())
        .unwrap_or_default()
}

fn native_json(t: &pb::ToolDefinition) -> Value {
    json!({
        "id": t.id,
        "name": t.name,
        "description": t.description,
        "version": t.version,
        "category": enum_name(pb::Category::try_from(t.category).ok().map(|c| c.as_str_name()), "CATEGORY_"),
        "input_schema": serde_json::from_str::<Value>(&t.input_schema_json).unwrap_or(Value::Null),
        "output_schema": serde_json::from_str::<Value>(&t.output_schema_json).unwrap_or(Value::Null),
        "sandbox_required": t.sandbox_required,
        "side_effect": enum_name(pb::SideEffect::try_from(t.side_effect).ok().map(|c| c.as_str_name()), "SIDE_EFFECT_"),
        "determinism": enum_name(pb::Determinism::try_from(t.determinism).ok().map(|c| c.as_str_name()), "DETERMINISM_"),
        "approval_policy": enum_name(pb::ApprovalPolicy::try_from(t.approval_policy).ok().map(|c| c.as_str_name()), "APPROVAL_POLICY_"),
        "timeout_ms": t.timeout_ms,
        "required_capabilities": t.required_capabilities,
        "aliases": t.aliases,
        "disabled_reason": (!t.disabled_reason.is_empty()).then_some(&t.disabled_reason),
    })
}

/// Initialises logging to stderr. Lines are written by a background thread, so a call's
/// audit event never waits on the terminal or a log pipe; the buffer is not lossy (audit
/// events are never dropped; a stuck reader slows callers instead). Keep the guard alive
/// until exit: dropping it flushes.
pub fn init_logging(format: LogFormat) -> tracing_appender::non_blocking::WorkerGuard {
    let filter = tracing_subscriber::EnvFilter::try_from_env("TOOLRUN_LOG")
        // rmcp logs every stateless MCP request's start and end at info: two lines per call.
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,rmcp=warn"));
    let (writer, guard) = tracing_appender::non_blocking::NonBlockingBuilder::default()
        .lossy(false)
        .finish(std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(writer);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().flatten_event(true).init(),
    }
    guard
}

/// The whole program: parses arguments, runs the command, returns the exit code.
pub fn main() -> i32 {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("toolrun: cannot start the async runtime: {e}");
            return EXIT_CONNECTION;
        }
    };
    runtime.block_on(async move {
        match cli.command {
            Command::Serve(args) => {
                let _log_guard = init_logging(cli.log_format);
                match serve_until_signal(args).await {
                    Ok(()) => 0,
                    Err(e) => {
                        tracing::error!("{e}");
                        eprintln!("toolrun serve: {e}");
                        1
                    }
                }
            }
            Command::Replay { file, config } => replay(&file, config.as_deref()).await,
            Command::Keys { action } => match keys(action) {
                Ok(code) => code,
                Err(e) => {
                    eprintln!("toolrun keys: {e}");
                    EXIT_USAGE
                }
            },
            Command::Bench(args) => match crate::bench::run(args).await {
                Ok(()) => 0,
                Err(e) => {
                    eprintln!("toolrun bench: {e}");
                    e.exit_code()
                }
            },
            command => match run_client(command).await {
                Ok(code) => code,
                Err(e) => {
                    eprintln!("toolrun: {e}");
                    e.exit_code()
                }
            },
        }
    })
}

async fn serve_until_signal(args: ServeArgs) -> Result<(), crate::serve::ServeError> {
    let running = crate::serve::start(args).await?;
    let stop = running.shutdown_token();
    tokio::spawn(async move {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("SIGTERM handler");
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM received"),
            _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT received"),
        }
        stop.cancel();
    });
    running.wait().await
}
