//! The kubernetes backend: each run is a `ToolRun` that the toolrun operator runs as a
//! locked-down pod; the result comes back through the ToolRun's status.
//!
//! - One watch ([`watch::SharedWatch`]) serves every in-flight call; a call registers under
//!   its ToolRun's name before creating it (names are made here, not by `generateName`,
//!   for exactly that reason), so no change can slip between create and wait, and a relist
//!   after a broken watch delivers the current state.
//! - StreamTool output is the pod log followed live ([`logs::follow`]); the record is
//!   always the status's.
//! - A cancelled or abandoned call sets `spec.cancel: true` (merge patch) and returns at
//!   once; the operator stops the pod.
//! - A run whose pod does not start and finish within its timeout plus
//!   `startTimeoutSeconds` is cancelled the same way and reported (INFRA_ERROR when the pod
//!   never started, TIMEOUT when it did).

pub mod convert;
pub mod logs;
pub mod startup;
pub mod watch;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, Resource};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use toolrun_crd::ToolRun;
use toolrun_runner::{RunRecord, Verdict};

pub use startup::StartError;

use self::convert::{CREATED_BY, CREATED_BY_VALUE};
use self::logs::Forwarded;
use self::watch::{Seen, SharedWatch};
use crate::config::KubernetesConfig;
use crate::metrics::Metrics;
use crate::sandbox::{Mechanism, Sandbox, SandboxError, SandboxInfo, SandboxRun};
use crate::tool::StreamChunk;

/// How long a cancel patch may take before the call returns anyway (the ToolRun's TTL and
/// activeDeadlineSeconds still end the pod).
const CANCEL_PATCH_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a finished run waits for its log follower to forward the last chunks.
const FOLLOWER_DRAIN: Duration = Duration::from_secs(2);
/// How long startup waits for the watch's first list.
const WATCH_READY_TIMEOUT: Duration = Duration::from_secs(30);

/// Metrics of the backend (registered by [`Metrics`]).
#[derive(Clone, Default)]
pub struct KubeMetrics {
    /// `toolrun_kube_watch_restarts_total`.
    pub watch_restarts: Counter,
    /// `toolrun_kube_inflight_runs`.
    pub inflight_runs: Gauge,
}

impl KubeMetrics {
    /// The gateway's registered instances.
    pub fn from_metrics(m: &Metrics) -> Self {
        KubeMetrics {
            watch_restarts: m.kube_watch_restarts.clone(),
            inflight_runs: m.kube_inflight_runs.clone(),
        }
    }
}

/// Runs code as ToolRuns in one namespace.
pub struct KubernetesSandbox {
    inner: Arc<Inner>,
    info: SandboxInfo,
}

struct Inner {
    runs: Api<ToolRun>,
    pods: Api<Pod>,
    config: KubernetesConfig,
    watch: Arc<SharedWatch>,
    metrics: KubeMetrics,
    /// Stops the watch task when the backend is dropped.
    _stop: tokio_util::sync::DropGuard,
}

impl KubernetesSandbox {
    /// Connects with the client from the environment, checks the cluster (CRD, RBAC,
    /// namespace) and starts the shared watch.
    pub async fn connect(
        config: &KubernetesConfig,
        metrics: KubeMetrics,
    ) -> Result<Self, StartError> {
        let client = startup::client().await?;
        Self::with_client(client, config, metrics).await
    }

    /// As [`KubernetesSandbox::connect`], with a given client.
    pub async fn with_client(
        client: Client,
        config: &KubernetesConfig,
        metrics: KubeMetrics,
    ) -> Result<Self, StartError> {
        let ns = config.namespace.as_str();
        let api_version = ToolRun::api_version(&());
        startup::check_crd(&client, &api_version, &ToolRun::plural(&())).await?;
        startup::check_access(&client, ns).await?;
        let runs: Api<ToolRun> = Api::namespaced(client.clone(), ns);
        let probe = convert::tool_run("toolrun-gateway-probe", &probe_run(), config)
            .expect("the probe fits the CRD");
        startup::check_namespace(&runs, &probe).await?;

        let stop = CancellationToken::new();
        let selector = format!("{CREATED_BY}={CREATED_BY_VALUE}");
        let watch = SharedWatch::start(
            runs.clone(),
            &selector,
            metrics.watch_restarts.clone(),
            stop.clone(),
        );
        watch
            .ready(WATCH_READY_TIMEOUT)
            .await
            .map_err(|message| StartError::Watch {
                namespace: ns.to_string(),
                message,
            })?;
        let info = info(config);
        for m in &info.mechanisms {
            tracing::info!(mechanism = %m.name, active = m.active, detail = %m.detail, "sandbox mechanism");
        }
        Ok(KubernetesSandbox {
            inner: Arc::new(Inner {
                runs,
                pods: Api::namespaced(client, ns),
                config: config.clone(),
                watch,
                metrics,
                _stop: stop.drop_guard(),
            }),
            info,
        })
    }

    /// Calls waiting on the shared watch now.
    pub fn waiting_calls(&self) -> usize {
        self.inner.watch.waiters()
    }
}

fn info(config: &KubernetesConfig) -> SandboxInfo {
    let m = |name: &str, detail: String| Mechanism {
        name: name.into(),
        active: true,
        detail,
    };
    SandboxInfo {
        backend: "kubernetes".into(),
        mechanisms: vec![
            m(
                "toolrun-operator-pod",
                "each run is a ToolRun the toolrun operator runs as a pod: non-root, read-only \
                 root, all capabilities dropped, no privilege escalation, seccomp \
                 RuntimeDefault, no service-account token, requests = limits, \
                 activeDeadlineSeconds, memory-backed size-capped /tmp; enforced by the \
                 operator, not the gateway"
                    .into(),
            ),
            m(
                "deny-all-network-policy",
                format!(
                    "NetworkPolicy toolrun-sandbox-deny-all (ingress and egress) in namespace {}, \
                     made by the operator and the Helm chart",
                    config.namespace
                ),
            ),
            m(
                "namespace",
                format!(
                    "ToolRuns are created in namespace {} with label {CREATED_BY}={CREATED_BY_VALUE}",
                    config.namespace
                ),
            ),
            m(
                "runtime-class",
                match &config.runtime_class_name {
                    Some(rc) => format!("pods run with RuntimeClass {rc}"),
                    None => "the cluster's default runtime (no runtimeClassName)".into(),
                },
            ),
            m(
                "shared-watch",
                "one label-selected watch on ToolRuns serves every in-flight call".into(),
            ),
            m(
                "limits",
                format!(
                    "timeout, memory, processes and output (at most {} bytes per stream) go \
                     into the ToolRun's limits; start bound {} s",
                    toolrun_crd::MAX_OUTPUT_BYTES,
                    config.start_timeout_seconds
                ),
            ),
        ],
    }
}

/// A harmless run for the startup dry-run.
fn probe_run() -> SandboxRun {
    let limits = crate::config::Limits::default();
    SandboxRun {
        language: "python".into(),
        spec: toolrun_runner::RunSpec {
            language: toolrun_runner::Language::Python,
            code: "pass".into(),
            args: Vec::new(),
            env: Default::default(),
            stdin: String::new(),
            interpreter: "/usr/bin/python3".into(),
            workdir: "/tmp".into(),
            limits: crate::sandbox::runner_limits(&limits, 1_000),
            setup: Default::default(),
        },
        limits,
        tool: "run_code".into(),
        call_id: "startup-probe".into(),
        tenant: String::new(),
        workspace: None,
        session: None,
        image: None,
    }
}

/// A fresh ToolRun name: `run-` and 16 hex digits of a random UUID (64 bits: no
/// collision in practice; one is refused by the API server, never overwritten).
fn new_name() -> String {
    let id = uuid::Uuid::new_v4().simple().to_string();
    format!("run-{}", &id[..16])
}

/// Keeps the in-flight accounting right and, if the call is dropped or cancelled before
/// its run finished (client gone, deadline, shutdown), marks the ToolRun cancelled.
struct RunGuard {
    inner: Arc<Inner>,
    name: String,
    /// Created and not finished: must be cancelled if abandoned.
    live: bool,
    follower: Option<(CancellationToken, tokio::task::JoinHandle<()>)>,
}

impl RunGuard {
    fn finish(&mut self) {
        self.live = false;
    }

    async fn cancel(&mut self) -> Result<(), String> {
        let patched = patch_cancel(&self.inner.runs, &self.name).await;
        // Only now: the executor drops this call the moment it sees the same cancel, often
        // in the middle of the patch above, and then Drop must patch again.
        self.live = false;
        patched
    }

    /// Waits (briefly) for the log follower to forward what is left, then stops it.
    async fn drain_follower(&mut self) {
        if let Some((stop, mut join)) = self.follower.take()
            && tokio::time::timeout(FOLLOWER_DRAIN, &mut join)
                .await
                .is_err()
        {
            stop.cancel();
            join.abort();
        }
    }
}

impl Drop for RunGuard {
    fn drop(&mut self) {
        self.inner.watch.unregister(&self.name);
        self.inner.metrics.inflight_runs.dec();
        if let Some((stop, join)) = self.follower.take() {
            stop.cancel();
            join.abort();
        }
        if self.live
            && let Ok(rt) = tokio::runtime::Handle::try_current()
        {
            let runs = self.inner.runs.clone();
            let name = std::mem::take(&mut self.name);
            rt.spawn(async move {
                if let Err(e) = patch_cancel(&runs, &name).await {
                    tracing::warn!(toolrun = %name, error = %e, "cancelling an abandoned ToolRun failed");
                }
            });
        }
    }
}

async fn patch_cancel(runs: &Api<ToolRun>, name: &str) -> Result<(), String> {
    let patch = serde_json::json!({"spec": {"cancel": true}});
    match tokio::time::timeout(
        CANCEL_PATCH_TIMEOUT,
        runs.patch(name, &PatchParams::default(), &Patch::Merge(&patch)),
    )
    .await
    {
        Ok(Ok(_)) => Ok(()),
        // Already gone: nothing left to stop.
        Ok(Err(kube::Error::Api(s))) if s.is_not_found() => Ok(()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("no answer within {CANCEL_PATCH_TIMEOUT:?}")),
    }
}

#[async_trait]
impl Sandbox for KubernetesSandbox {
    fn info(&self) -> SandboxInfo {
        self.info.clone()
    }

    fn start_allowance(&self) -> Duration {
        Duration::from_secs(self.inner.config.start_timeout_seconds)
    }

    async fn run(
        &self,
        run: SandboxRun,
        stream: Option<mpsc::Sender<StreamChunk>>,
        cancel: CancellationToken,
    ) -> Result<RunRecord, SandboxError> {
        if run.workspace.is_some() {
            // A host directory means nothing to a pod: sessions here are ToolSessions.
            return Err(SandboxError::Rejected(
                "a local workspace cannot be used by the kubernetes backend (sessions are \
                 ToolSessions: SandboxRun.session)"
                    .into(),
            ));
        }
        let inner = &self.inner;
        let started = Instant::now();
        let name = new_name();
        let tr = convert::tool_run(&name, &run, &inner.config)
            .map_err(|e| SandboxError::Rejected(e.to_string()))?;
        let ns = inner.config.namespace.as_str();
        let timeout = Duration::from_millis(run.spec.limits.timeout_ms);
        let start_allowance = Duration::from_secs(inner.config.start_timeout_seconds);
        let bound = started + timeout + start_allowance;

        // Registered before the create: every change of the ToolRun reaches this call.
        let mut seen = inner.watch.register(&name);
        inner.metrics.inflight_runs.inc();
        let mut guard = RunGuard {
            inner: inner.clone(),
            name: name.clone(),
            live: false,
            follower: None,
        };
        // Not raced against `cancel`: a create abandoned mid-flight could still land after
        // the cancel patch. A cancel meanwhile is seen right after, below.
        if let Err(e) = inner.runs.create(&PostParams::default(), &tr).await {
            return Err(SandboxError::Setup(format!(
                "creating ToolRun {ns}/{name}: {e}"
            )));
        }
        guard.live = true;
        tracing::debug!(toolrun = %name, namespace = ns, "ToolRun created");

        let forwarded = Arc::new(Mutex::new(Forwarded::default()));
        if let Some(tx) = stream {
            let stop = CancellationToken::new();
            let cap = usize::try_from(run.limits.output_limit_bytes)
                .unwrap_or(usize::MAX)
                .min(toolrun_crd::MAX_OUTPUT_BYTES as usize);
            let join = tokio::spawn(logs::follow(
                inner.pods.clone(),
                name.clone(),
                seen.clone(),
                cap,
                tx,
                forwarded.clone(),
                stop.clone(),
            ));
            guard.follower = Some((stop, join));
        }

        let mut pod_started = false;
        loop {
            let current = seen.borrow_and_update().clone();
            match current {
                Seen::Object(tr) => {
                    let status = tr.status.as_ref();
                    if let Some(record) = status.and_then(convert::record_from_status) {
                        guard.finish();
                        guard.drain_follower().await;
                        return Ok(record);
                    }
                    pod_started |= convert::has_started(status);
                }
                Seen::Deleted => {
                    guard.finish();
                    return Ok(convert::synthetic_record(
                        Verdict::InfraError,
                        elapsed_ms(started),
                        String::new(),
                        String::new(),
                        format!("ToolRun {ns}/{name} was deleted before it finished"),
                    ));
                }
                Seen::Nothing => {}
            }
            tokio::select! {
                biased;
                _ = cancel.cancelled() => {
                    let out = forwarded.lock().expect("not poisoned").clone();
                    return Ok(cancelled(&mut guard, started, &out).await);
                }
                _ = tokio::time::sleep_until(bound) => {
                    let out = forwarded.lock().expect("not poisoned").clone();
                    if let Err(e) = guard.cancel().await {
                        tracing::warn!(toolrun = %name, error = %e, "cancelling a ToolRun past its start bound failed");
                    }
                    let (verdict, message) = if pod_started {
                        (Verdict::Timeout, format!(
                            "no result from ToolRun {ns}/{name} within its {} ms timeout plus \
                             the {} s start allowance; cancelled",
                            timeout.as_millis(), start_allowance.as_secs()))
                    } else {
                        (Verdict::InfraError, format!(
                            "the pod of ToolRun {ns}/{name} did not start within {} s \
                             (startTimeoutSeconds) plus the {} ms timeout; cancelled. Check \
                             that the toolrun operator is running and the pod can be scheduled",
                            start_allowance.as_secs(), timeout.as_millis()))
                    };
                    return Ok(convert::synthetic_record(
                        verdict, elapsed_ms(started), out.stdout, out.stderr, message));
                }
                changed = seen.changed() => {
                    if changed.is_err() {
                        return Err(SandboxError::Setup("the ToolRun watch stopped".into()));
                    }
                }
            }
        }
    }
}

async fn cancelled(guard: &mut RunGuard, started: Instant, out: &Forwarded) -> RunRecord {
    let message = match guard.cancel().await {
        Ok(()) => format!(
            "cancelled by the caller (ToolRun {} marked spec.cancel)",
            guard.name
        ),
        Err(e) => format!(
            "cancelled by the caller; marking ToolRun {} cancelled failed: {e}",
            guard.name
        ),
    };
    convert::synthetic_record(
        Verdict::Cancelled,
        elapsed_ms(started),
        out.stdout.clone(),
        out.stderr.clone(),
        message,
    )
}

fn elapsed_ms(since: Instant) -> u64 {
    u64::try_from(since.elapsed().as_millis()).unwrap_or(u64::MAX)
}
