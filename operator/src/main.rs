//! `toolrun-operator`: parse flags, load the configuration, call [`toolrun_operator::run`].

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context as _;
use clap::{Parser, ValueEnum};
use toolrun_operator::{Config, Identity};

/// The toolrun operator: runs each ToolRun in a locked-down pod and records its result.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// YAML configuration file (without it: the built-in defaults).
    #[arg(long, env = "TOOLRUN_OPERATOR_CONFIG")]
    config: Option<PathBuf>,
    /// Address of /metrics, /healthz and /readyz (overrides controller.metricsListen).
    #[arg(long, env = "TOOLRUN_OPERATOR_METRICS_LISTEN")]
    metrics_listen: Option<SocketAddr>,
    /// Serve the session relay (toolrun.v1.SessionRelay, for the gateway) here, e.g.
    /// 0.0.0.0:50052. Off when unset.
    #[arg(
        long,
        env = "TOOLRUN_OPERATOR_RELAY_LISTEN",
        requires = "relay_token_file"
    )]
    relay_listen: Option<SocketAddr>,
    /// File holding the relay's bearer token (the chart's generated Secret).
    #[arg(long, env = "TOOLRUN_OPERATOR_RELAY_TOKEN_FILE")]
    relay_token_file: Option<PathBuf>,
    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text, env = "TOOLRUN_LOG_FORMAT")]
    log_format: LogFormat,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum LogFormat {
    Json,
    Text,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let logs = tracing_subscriber::fmt().with_env_filter(filter);
    match args.log_format {
        LogFormat::Json => logs.json().init(),
        LogFormat::Text => logs.init(),
    }
    let mut config = match &args.config {
        Some(path) => Config::from_file(path)?,
        None => Config::default(),
    };
    if let Some(addr) = args.metrics_listen {
        config.controller.metrics_listen = addr;
    }
    if let (Some(listen), Some(token_file)) = (args.relay_listen, args.relay_token_file) {
        config.controller.relay = Some(
            toolrun_operator::session::relay_server::RelayServerConfig::new(listen, token_file),
        );
    }
    let client = toolrun_operator::client(&config.controller).await?;
    let identity = Identity::from_env(&config.operator.namespace);
    toolrun_operator::run(
        client,
        config.operator,
        config.controller,
        identity,
        shutdown_signal(),
    )
    .await
    .context("toolrun-operator")
}

/// SIGTERM (Kubernetes stopping the pod) or Ctrl-C.
async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("installing the SIGTERM handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    tracing::info!("shutting down");
}
