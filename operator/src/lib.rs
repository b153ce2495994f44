//! The toolrun operator: turns each ToolRun into a ConfigMap and a locked-down pod, and
//! the runner's record in the pod's log into the ToolRun's status.
//!
//! Each kind has its folder:
//! - [`toolrun`]: ToolRuns (builders, the pure decision, the controller, log followers);
//! - [`toolsession`]: ToolSessions into agent pods with a workspace, and their idle expiry;
//!   [`session`]: the relay serving the gateway's file tools in those pods;
//! - [`warmpool`]: ready agent pods that one-shot runs bind to instead of starting a pod,
//!   and the runs carried to them through [`relay`] (pods/attach);
//! - [`network_policy`]: the sandbox namespace's deny-all NetworkPolicy, applied at
//!   start-up and restored while leading;
//!
//! and beside them:
//! - [`reconcile`]: what every kind's reconciler shares (the context, status apply with
//!   the resourceVersion read, errors, events, backoff, the fresh-read memo, the
//!   bookkeeping of per-pod tasks); [`pods`]: what a sandbox pod shows (running, pending
//!   and why, finished), read the same way by every kind;
//! - [`config`]: the YAML configuration ([`Config`]: [`OperatorConfig`] for the
//!   builders, [`ControllerConfig`] for the controller);
//! - [`leader`]: Lease-based leader election; [`ratelimit`]: the client-side token
//!   bucket; [`metrics`]: Prometheus metrics and the admin port.
//!
//! [`run`] puts them together; `main.rs` only parses flags and calls it.

pub mod config;
pub mod leader;
pub mod metrics;
pub mod network_policy;
pub mod pods;
pub mod ratelimit;
pub mod reconcile;
pub mod relay;
pub mod session;
pub mod toolrun;
pub mod toolsession;
pub mod warmpool;

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::Ordering;

pub use config::{Config, ConfigError, ControllerConfig, OperatorConfig};
use tokio_util::sync::CancellationToken;
pub use toolrun::builders::BuildError;
pub use toolrun::record::{RecordError, record_from_log};
use tracing::{info, warn};

use crate::metrics::{AdminState, Metrics};
use crate::reconcile::Context;

/// Why the operator could not run.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The kube client could not be configured.
    #[error("configuring the Kubernetes client: {0}")]
    Client(#[source] kube::Error),
    /// The metrics listener could not be bound.
    #[error("binding the metrics listener {addr}: {source}")]
    Listen {
        /// The address.
        addr: std::net::SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Leader election failed to start.
    #[error(transparent)]
    Leader(#[from] leader::Error),
    /// The session relay could not start (token file, listener).
    #[error("session relay: {0}")]
    Relay(String),
}

/// Who this replica is: its leader-election identity and the namespace of its Lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// Unique among replicas (the pod name).
    pub name: String,
    /// Namespace of the Lease (the operator's own).
    pub lease_namespace: String,
}

impl Identity {
    /// From the environment: `POD_NAME` (else the hostname) and `POD_NAMESPACE` (else
    /// `fallback_namespace`).
    pub fn from_env(fallback_namespace: &str) -> Identity {
        let nonempty = |v: String| (!v.trim().is_empty()).then(|| v.trim().to_string());
        let name = std::env::var("POD_NAME")
            .ok()
            .and_then(nonempty)
            .or_else(|| {
                std::fs::read_to_string("/proc/sys/kernel/hostname")
                    .ok()
                    .and_then(nonempty)
            })
            .unwrap_or_else(|| format!("toolrun-operator-{}", std::process::id()));
        let lease_namespace = std::env::var("POD_NAMESPACE")
            .ok()
            .and_then(nonempty)
            .unwrap_or_else(|| fallback_namespace.to_string());
        Identity {
            name,
            lease_namespace,
        }
    }
}

/// A kube client from the environment (in-cluster, or KUBECONFIG) whose requests pass
/// a token bucket of `ctl.api_qps` per second and bursts of `ctl.api_burst`.
pub async fn client(ctl: &ControllerConfig) -> Result<kube::Client, Error> {
    let config = kube::Config::infer()
        .await
        .map_err(|e| Error::Client(kube::Error::InferConfig(e)))?;
    rate_limited_client(config, ctl)
}

/// A client for `config` behind the token bucket of `ctl`.
pub fn rate_limited_client(
    config: kube::Config,
    ctl: &ControllerConfig,
) -> Result<kube::Client, Error> {
    let builder = kube::client::ClientBuilder::try_from(config).map_err(Error::Client)?;
    Ok(builder
        .with_layer(&ratelimit::RateLimitLayer::new(ctl.api_qps, ctl.api_burst))
        .build())
}

/// Runs the operator until `shutdown` resolves: the admin port, the deny-all
/// NetworkPolicy, leader election, and the controllers while this replica leads.
/// On shutdown the controller lets in-flight reconciles finish and the lease is released.
pub async fn run(
    client: kube::Client,
    config: OperatorConfig,
    ctl: ControllerConfig,
    identity: Identity,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    let metrics = Arc::new(Metrics::new());
    let admin = Arc::new(AdminState {
        ready: Default::default(),
        metrics: metrics.clone(),
    });
    let stop = CancellationToken::new();
    let listener = tokio::net::TcpListener::bind(ctl.metrics_listen)
        .await
        .map_err(|source| Error::Listen {
            addr: ctl.metrics_listen,
            source,
        })?;
    let admin_addr = listener.local_addr().ok();
    let admin_task = tokio::spawn(
        axum::serve(listener, metrics::router(admin.clone()))
            .with_graceful_shutdown(stop.clone().cancelled_owned())
            .into_future(),
    );
    let shutdown_task = {
        let stop = stop.clone();
        tokio::spawn(async move {
            shutdown.await;
            stop.cancel();
        })
    };
    info!(
        namespace = %config.namespace,
        identity = %identity.name,
        metrics = ?admin_addr,
        "toolrun-operator starting"
    );

    if let Err(e) = network_policy::ensure(&client, &config.namespace).await {
        // The chart ships the same policy; without the permission (or on a conflict) the
        // operator still runs, but says so.
        warn!(error = %e, "could not apply the deny-all NetworkPolicy");
    }
    let ctx = Arc::new(Context::new(
        client.clone(),
        config,
        &ctl,
        identity.name.clone(),
        metrics.clone(),
    ));
    if let Some(relay) = &ctl.relay {
        // Served by every replica: a pod's one attach stream is per process (relay::Pool),
        // shared with this process's runs in sessions and warm pods.
        session::relay_server::start(
            client.clone(),
            &ctx.config.namespace,
            relay,
            ctx.relay_pool.clone(),
            stop.clone(),
        )
        .await
        .map_err(Error::Relay)?;
    }

    let result = if ctl.leader_election.enabled {
        match leader::Leadership::start(client, &ctl.leader_election, &identity).await {
            Ok(mut leadership) => {
                admin.ready.store(true, Ordering::Release);
                lead_while_leader(&mut leadership, &ctx, &ctl, &stop, &identity).await;
                leadership.release().await;
                Ok(())
            }
            Err(e) => Err(Error::Leader(e)),
        }
    } else {
        admin.ready.store(true, Ordering::Release);
        metrics.leader.set(1);
        reconcile_all(&ctx, ctl.concurrency, stop.clone()).await;
        metrics.leader.set(0);
        Ok(())
    };
    admin.ready.store(false, Ordering::Release);
    stop.cancel();
    shutdown_task.abort();
    if let Ok(Err(e)) = admin_task.await {
        warn!(error = %e, "the admin server failed");
    }
    info!("toolrun-operator stopped");
    result
}

/// Reconciles during each term of leadership until `stop`.
async fn lead_while_leader(
    leadership: &mut leader::Leadership,
    ctx: &Arc<Context>,
    ctl: &ControllerConfig,
    stop: &CancellationToken,
    identity: &Identity,
) {
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            leading = leadership.wait_until_leader() => if !leading { return },
        }
        info!(identity = %identity.name, "holding the lease: reconciling");
        ctx.metrics.leader.set(1);
        let term = stop.child_token();
        let watch = leadership.stop_on_loss(term.clone());
        reconcile_all(ctx, ctl.concurrency, term).await;
        watch.abort();
        ctx.metrics.leader.set(0);
        if stop.is_cancelled() {
            return;
        }
        warn!(identity = %identity.name, "lost the lease: stopped reconciling");
    }
}

/// One term of leadership, until `stop`: every kind's controller (ToolRuns, ToolSessions,
/// the warm pool) and the NetworkPolicy guard. The ToolRun controller lets its in-flight
/// reconciles finish first (they may still pick warm pods); the others stop after it.
async fn reconcile_all(ctx: &Arc<Context>, concurrency: u16, stop: CancellationToken) {
    let others = CancellationToken::new();
    let pool = tokio::spawn(warmpool::keep(
        ctx.client.clone(),
        ctx.config.clone(),
        ctx.pool.clone(),
        others.clone(),
    ));
    let sessions = tokio::spawn(toolsession::run(ctx.clone(), others.clone()));
    let policy = tokio::spawn(network_policy::guard(ctx.clone(), others.clone()));
    toolrun::controller::run_controller(ctx.clone(), concurrency, stop.cancelled_owned()).await;
    others.cancel();
    let _ = tokio::join!(pool, sessions, policy);
}
