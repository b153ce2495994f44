//! ToolSessions: one locked-down agent pod per session, with its workspace volume, and the
//! session's idle expiry.
//!
//! - The pod is [`crate::toolrun::builders::agent_pod`] (the lockdown of every sandbox pod, a uid of
//!   its own, no token, the deny-all policy) named after the ToolSession, owned by it (so
//!   deleting the session deletes the pod and its volume), labelled with the session and its
//!   tenant, its agent serving `--workspace /workspace` with `--workspace-limit-bytes` the
//!   session's size (what GetSession reports as the limit). The workspace is an emptyDir with
//!   the session's `sizeMiB` as its limit (the pod's ephemeral storage grows by as much), or
//!   a PersistentVolumeClaim of `workspace.storageClassName` owned by the session, which
//!   outlives a pod: a lost pod is then made again on the same claim.
//! - From a warm pod when one fits: `sessionWarmPool: N` keeps N unclaimed session pods
//!   ([`warm_session_pod`]: the pod of a default session, no per-session data in it). A
//!   new session whose pod would be exactly that one ([`takes_warm_pod`]: no claim, the
//!   default size, limits and RuntimeClass) records the warm pod in its status first
//!   ([`SessionDecision::Bind`]), then claims it ([`SessionDecision::Claim`]: owner,
//!   session and tenant labels, the pool's labels removed, by a patch carrying the
//!   resourceVersion it was seen unclaimed at). A warm pod taken, failed or gone before
//!   the claim means a pod of its own, as without a pool. Nothing was sent to the pod
//!   before it is the session's: the session is Ready only after the claim.
//! - The status: Pending until the agent runs, Ready with `podName`, Failed with a message
//!   (the pod cannot start, or died with an emptyDir workspace), `lastActivity` (the
//!   gateway's `toolrun.dev/last-activity` annotation, else creation) and `expiresAt`.
//! - A session idle past its `idleTimeoutSeconds` is deleted here, so sessions end even when
//!   no gateway runs.
//!
//! [`decide`] is the pure half and unit tested; [`run`] watches ToolSessions and their pods
//! while this replica leads.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{
    EmptyDirVolumeSource, PersistentVolumeClaim, PersistentVolumeClaimSpec,
    PersistentVolumeClaimVolumeSource, Pod, Volume, VolumeMount, VolumeResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Config as RuntimeConfig, Controller};
use kube::runtime::events::EventType;
use kube::runtime::watcher;
use kube::{Api, Resource, ResourceExt};
use toolrun_crd::labels;
use toolrun_crd::session::{SessionPhase, ToolSession, ToolSessionSpec, ToolSessionStatus};
use tracing::{debug, info, warn};

use crate::config::OperatorConfig;
use crate::pods::{agent_running, elapsed, is_ready_warm_pod, is_terminal, pending_problem};
use crate::reconcile::{Context, Error, FIELD_MANAGER, apply_status, kube_err};
use crate::toolrun::builders;
use crate::warmpool;

/// Where programs and file tools see the workspace.
pub const WORKSPACE: &str = "/workspace";
/// Idle timeout when the session does not say (the gateway always does).
pub const DEFAULT_IDLE_SECONDS: u32 = 3600;
/// A session is looked at at least this often (idle expiry).
const RESYNC: Duration = Duration::from_secs(60);
/// A failed reconcile is tried again after this long.
pub const RETRY_AFTER: Duration = Duration::from_secs(2);

/// What to do about a session.
#[derive(Debug, Clone, PartialEq)]
pub enum SessionDecision {
    /// Idle past its timeout: delete the ToolSession (its pod and claim go with it).
    Expire,
    /// Make the workspace claim (PVC sessions) when missing, then the pod.
    CreatePod,
    /// Record this ready, unclaimed warm pod as the session's (status first).
    Bind(String),
    /// Make the recorded warm pod the session's: owner and labels, at this resourceVersion.
    Claim {
        /// The warm pod.
        pod: String,
        /// The version it was seen unclaimed at.
        resource_version: String,
    },
    /// Delete the pod (it failed with a claim that outlives it: it is made again).
    DeletePod(String),
    /// Put the sandbox label back on the session's pod: without it the deny-all
    /// NetworkPolicy does not select the pod (warm session pods of earlier versions lacked
    /// it, and a person may remove it).
    Isolate(String),
    /// Write this status (phase, podName, message; the times are added).
    Status(ToolSessionStatus),
    /// Nothing to do: look again after this long at the latest.
    Wait(Duration),
}

/// When the session was last used: the gateway's annotation, else its creation.
pub fn last_activity(ts: &ToolSession) -> Option<Timestamp> {
    ts.annotations()
        .get(labels::LAST_ACTIVITY)
        .and_then(|v| v.parse::<Timestamp>().ok())
        .or_else(|| ts.metadata.creation_timestamp.as_ref().map(|t| t.0))
}

/// When it expires unless used.
pub fn expires_at(ts: &ToolSession) -> Option<Timestamp> {
    let idle = ts.spec.idle_timeout_seconds.unwrap_or(DEFAULT_IDLE_SECONDS);
    last_activity(ts)?
        .checked_add(k8s_openapi::jiff::SignedDuration::from_secs(i64::from(
            idle,
        )))
        .ok()
}

/// The pod the session's status names (a claimed warm pod), else the one named after it.
pub fn pod_name(ts: &ToolSession) -> String {
    ts.status
        .as_ref()
        .and_then(|s| s.pod_name.clone())
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| ts.name_any())
}

/// What to do about `ts`, whose pod ([`pod_name`]) is `pod`, at `now`; `warm` is a ready,
/// unclaimed warm pod offered to a session that has no pod yet and [`takes_warm_pod`].
pub fn decide(
    ts: &ToolSession,
    pod: Option<&Pod>,
    warm: Option<&Pod>,
    now: Timestamp,
    grace: Duration,
) -> SessionDecision {
    let name = ts.name_any();
    let status = ts.status.clone().unwrap_or_default();
    if expires_at(ts).is_some_and(|e| now >= e) {
        return SessionDecision::Expire;
    }
    let persistent = ts.spec.workspace.storage_class_name.is_some();
    let failed = |message: String| {
        SessionDecision::Status(ToolSessionStatus {
            phase: Some(SessionPhase::Failed),
            pod_name: status.pod_name.clone(),
            message: Some(message),
            ..ToolSessionStatus::default()
        })
    };
    if status.phase == Some(SessionPhase::Failed) {
        return SessionDecision::Wait(RESYNC);
    }
    let want = |pod: String, phase: SessionPhase, message: Option<String>| {
        let s = ToolSessionStatus {
            phase: Some(phase),
            pod_name: Some(pod),
            message,
            ..ToolSessionStatus::default()
        };
        let same = status.phase == s.phase
            && status.pod_name == s.pod_name
            && status.message == s.message
            // At the status's precision: a Time is written in whole seconds, and the
            // gateway's last-activity has milliseconds (compared exactly, the status was
            // written again every second for as long as the session lived).
            && status.expires_at.as_ref().map(|t| t.0.as_second())
                == expires_at(ts).map(|e| e.as_second());
        if same {
            SessionDecision::Wait(RESYNC)
        } else {
            SessionDecision::Status(s)
        }
    };
    let Some(p) = pod else {
        if status.phase == Some(SessionPhase::Ready) && !persistent {
            return failed(format!(
                "session pod {} disappeared; its workspace (an emptyDir) went with it",
                pod_name(ts)
            ));
        }
        if status.pod_name.is_none()
            && let Some(w) = warm
        {
            return SessionDecision::Bind(w.name_any());
        }
        // Also when a recorded warm pod went before it was claimed: a pod of its own.
        return SessionDecision::CreatePod;
    };
    let pod_name = p.name_any();
    let owned = p
        .owner_references()
        .iter()
        .any(|o| o.controller == Some(true) && Some(&o.uid) == ts.metadata.uid.as_ref());
    if !owned {
        if pod_name == name {
            return failed(format!(
                "a pod named {name} exists and is not this session's"
            ));
        }
        // The warm pod recorded in the status: claim it while it is still free, else
        // (taken, failing, going) make a pod of its own.
        return match p.metadata.resource_version.clone() {
            Some(resource_version) if is_ready_warm_pod(p) && is_session_pool_pod(p) => {
                SessionDecision::Claim {
                    pod: pod_name,
                    resource_version,
                }
            }
            _ => SessionDecision::CreatePod,
        };
    }
    if is_terminal(p) || p.metadata.deletion_timestamp.is_some() {
        if persistent {
            return if p.metadata.deletion_timestamp.is_some() {
                SessionDecision::Wait(Duration::from_secs(1))
            } else {
                SessionDecision::DeletePod(pod_name)
            };
        }
        let reason = p
            .status
            .as_ref()
            .and_then(|s| s.reason.clone().or(s.message.clone()))
            .unwrap_or_else(|| "stopped".into());
        return failed(format!(
            "session pod {} ended ({reason}); its workspace (an emptyDir) went with it",
            p.name_any()
        ));
    }
    if p.labels().get(labels::SANDBOX).map(String::as_str) != Some(labels::SANDBOX_VALUE) {
        return SessionDecision::Isolate(pod_name);
    }
    if agent_running(p) {
        return want(pod_name, SessionPhase::Ready, None);
    }
    if let Some(problem) = pending_problem(p) {
        if elapsed(p.metadata.creation_timestamp.as_ref(), now) >= grace {
            return failed(problem);
        }
        return want(pod_name, SessionPhase::Pending, Some(problem));
    }
    want(pod_name, SessionPhase::Pending, None)
}

fn owner(ts: &ToolSession) -> OwnerReference {
    OwnerReference {
        api_version: ToolSession::api_version(&()).into(),
        kind: ToolSession::kind(&()).into(),
        name: ts.name_any(),
        uid: ts.metadata.uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

/// Name of a persistent session's workspace claim.
pub fn claim_name(session: &str) -> String {
    format!("{session}-workspace")
}

/// The session's pod: an agent pod with the workspace volume at [`WORKSPACE`], named
/// after the session.
pub fn session_pod(ts: &ToolSession, config: &OperatorConfig) -> Result<Pod, builders::BuildError> {
    workspace_pod(&ts.name_any(), ts, config)
}

/// A warm session pod named `name`: the pod of a session with every default (no owner,
/// no session or tenant label: those come with the claim), labelled for the pool.
pub fn warm_session_pod(
    name: &str,
    pool_labels: BTreeMap<String, String>,
    config: &OperatorConfig,
) -> Result<Pod, builders::BuildError> {
    let template = ToolSession::new(
        name,
        ToolSessionSpec {
            session_id: String::new(),
            approval_mode: Default::default(),
            idle_timeout_seconds: None,
            workspace: Default::default(),
            limits: Default::default(),
            runtime_class_name: None,
        },
    );
    let mut pod = workspace_pod(name, &template, config)?;
    pod.metadata.owner_references = None;
    // The pool's labels instead of the session and tenant ones; the sandbox label (what the
    // deny-all NetworkPolicy selects) and the managed-by label stay.
    let labels = pod.metadata.labels.get_or_insert_with(BTreeMap::new);
    labels.remove(labels::SESSION);
    labels.remove(labels::TENANT);
    labels.extend(pool_labels);
    Ok(pod)
}

/// A session whose pod would be exactly a warm session pod (same spec but for its uid):
/// it may take one.
pub fn takes_warm_pod(ts: &ToolSession, config: &OperatorConfig) -> bool {
    if config.session_warm_pool == 0 || ts.spec.workspace.storage_class_name.is_some() {
        return false;
    }
    let (Ok(own), Ok(warm)) = (
        session_pod(ts, config),
        warm_session_pod("warm", BTreeMap::new(), config),
    ) else {
        return false;
    };
    warmpool::pod_spec_hash(&own) == warmpool::pod_spec_hash(&warm)
}

/// A pod of the session pool (not a one-shot language pool).
pub fn is_session_pool_pod(p: &Pod) -> bool {
    p.labels().get(labels::WARM_POOL).map(String::as_str) == Some(warmpool::SESSION_POOL)
}

/// A pod for `ts` named `name`.
fn workspace_pod(
    name: &str,
    ts: &ToolSession,
    config: &OperatorConfig,
) -> Result<Pod, builders::BuildError> {
    let session = ts.name_any();
    let tenant = ts.labels().get(labels::TENANT).cloned().unwrap_or_default();
    let pod_labels = BTreeMap::from([
        (labels::SESSION.to_string(), labels::label_value(&session)),
        (labels::TENANT.to_string(), tenant),
    ]);
    let mut pod = builders::agent_pod(name, "python", pod_labels, config)?;
    let size = ts
        .spec
        .workspace
        .size_mib
        .unwrap_or(config.session_workspace_mib);
    // The pod's own resources: the session's limits (runs take theirs from the request).
    let limits = builders::resolve_limits(&ts.spec.limits, config)?;
    pod.metadata.owner_references = Some(vec![owner(ts)]);
    let spec = pod.spec.as_mut().expect("agent_pod sets the spec");
    if let Some(rc) = &ts.spec.runtime_class_name {
        if config.runtime_class_name.as_deref() != Some(rc.as_str())
            && !config.allowed_runtime_class_names.contains(rc)
        {
            return Err(builders::BuildError::RuntimeClassNotAllowed(rc.clone()));
        }
        spec.runtime_class_name = Some(rc.clone());
    }
    let persistent = ts.spec.workspace.storage_class_name.is_some();
    let volume = if persistent {
        Volume {
            name: "workspace".into(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: claim_name(&session),
                read_only: Some(false),
            }),
            ..Volume::default()
        }
    } else {
        Volume {
            name: "workspace".into(),
            empty_dir: Some(EmptyDirVolumeSource {
                medium: None,
                size_limit: Some(Quantity(format!("{size}Mi"))),
            }),
            ..Volume::default()
        }
    };
    spec.volumes.get_or_insert_with(Vec::new).push(volume);
    // Writable by the pod's uid on a claim too.
    if let Some(sc) = spec.security_context.as_mut() {
        sc.fs_group = sc.run_as_user;
    }
    let c = &mut spec.containers[0];
    // The agent reports the workspace's usage against its size: statvfs of an emptyDir shows
    // the node's disk, not the sizeLimit (on a claim the agent reports the smaller).
    c.command.get_or_insert_with(Vec::new).extend([
        "--workspace".to_string(),
        WORKSPACE.to_string(),
        "--workspace-limit-bytes".to_string(),
        (u64::from(size) << 20).to_string(),
    ]);
    c.working_dir = Some(WORKSPACE.into());
    c.volume_mounts
        .get_or_insert_with(Vec::new)
        .push(VolumeMount {
            name: "workspace".into(),
            mount_path: WORKSPACE.into(),
            ..VolumeMount::default()
        });
    if let Some(res) = c.resources.as_mut() {
        let mut amounts = res.limits.clone().unwrap_or_default();
        amounts.insert("cpu".into(), Quantity(format!("{}m", limits.cpu_millis)));
        amounts.insert(
            "memory".into(),
            Quantity(format!("{}Mi", limits.memory_mib)),
        );
        if !persistent {
            // The emptyDir counts against the pod's ephemeral storage.
            let eph = config.ephemeral_storage_mib + size;
            amounts.insert("ephemeral-storage".into(), Quantity(format!("{eph}Mi")));
        }
        let mut requests = amounts.clone();
        if let Some(m) = config.session_cpu_request_millis {
            let cpu = m.min(limits.cpu_millis);
            requests.insert("cpu".into(), Quantity(format!("{cpu}m")));
        }
        res.requests = Some(requests);
        res.limits = Some(amounts);
    }
    // Init containers (the runner copied in) count too: the pod requests the largest of
    // them and the sum of its containers.
    if let (Some(m), Some(inits)) = (
        config.session_cpu_request_millis,
        spec.init_containers.as_mut(),
    ) {
        let cpu = m.min(limits.cpu_millis);
        for c in inits {
            if let Some(req) = c.resources.as_mut().and_then(|r| r.requests.as_mut()) {
                req.insert("cpu".into(), Quantity(format!("{cpu}m")));
            }
        }
    }
    Ok(pod)
}

/// The workspace claim of a persistent session.
pub fn workspace_claim(ts: &ToolSession, config: &OperatorConfig) -> PersistentVolumeClaim {
    let size = ts
        .spec
        .workspace
        .size_mib
        .unwrap_or(config.session_workspace_mib);
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(claim_name(&ts.name_any())),
            namespace: ts.namespace(),
            labels: Some(BTreeMap::from([(
                labels::SESSION.to_string(),
                labels::label_value(&ts.name_any()),
            )])),
            owner_references: Some(vec![owner(ts)]),
            ..ObjectMeta::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec!["ReadWriteOnce".into()]),
            storage_class_name: ts.spec.workspace.storage_class_name.clone(),
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([(
                    "storage".to_string(),
                    Quantity(format!("{size}Mi")),
                )])),
                ..VolumeResourceRequirements::default()
            }),
            ..PersistentVolumeClaimSpec::default()
        }),
        ..PersistentVolumeClaim::default()
    }
}

async fn reconcile(ts: Arc<ToolSession>, ctx: Arc<Context>) -> Result<Action, Error> {
    let result = look(ts.clone(), ctx.clone()).await;
    if result.is_ok() {
        ctx.session_backoff.succeeded(&ts.name_any());
    }
    result
}

/// One look at one session: decide, do it.
async fn look(ts: Arc<ToolSession>, ctx: Arc<Context>) -> Result<Action, Error> {
    if ts.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let ns = ctx.config.namespace.clone();
    let name = ts.name_any();
    let sessions: Api<ToolSession> = Api::namespaced(ctx.client.clone(), &ns);
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let pod_name = pod_name(&ts);
    let pod = pods
        .get_opt(&pod_name)
        .await
        .map_err(kube_err("reading the pod"))?;
    let now = Timestamp::now();
    let mut decision = decide(&ts, pod.as_ref(), None, now, ctx.pending_grace);
    // A session about to start a pod takes a warm one when it may and one is ready.
    if decision == SessionDecision::CreatePod
        && pod.is_none()
        && takes_warm_pod(&ts, &ctx.config)
        && let Some(warm) = ctx.pool.pick(warmpool::SESSION_POOL)
    {
        decision = decide(&ts, None, Some(&warm), now, ctx.pending_grace);
    }
    debug!(session = %name, ?decision, "session decided");
    if decision == SessionDecision::Expire && runs_in_flight(&ts, &ctx).await? > 0 {
        // Not idle while a program runs in it (the gateway marks use when a call starts,
        // so a call longer than the idle timeout would otherwise lose its session).
        debug!(session = %name, "idle by its annotation, but a run is in flight: kept");
        return Ok(Action::requeue(Duration::from_secs(2)));
    }
    match decision {
        SessionDecision::Expire => {
            info!(session = %name, "idle past its timeout: deleting the session");
            let dp = DeleteParams {
                preconditions: ts.metadata.uid.clone().map(|uid| kube::api::Preconditions {
                    uid: Some(uid),
                    resource_version: None,
                }),
                ..DeleteParams::default()
            };
            match sessions.delete(&name, &dp).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(kube_err("deleting the session")(e)),
            }
            ctx.relay_pool.forget(&pod_name);
            Ok(Action::await_change())
        }
        SessionDecision::CreatePod => {
            let pod = match session_pod(&ts, &ctx.config) {
                Ok(p) => p,
                Err(e) => {
                    let st = ToolSessionStatus {
                        phase: Some(SessionPhase::Failed),
                        message: Some(format!("invalid ToolSession: {e}")),
                        ..ToolSessionStatus::default()
                    };
                    write_status(&sessions, &ts, st).await?;
                    return Ok(Action::requeue(RESYNC));
                }
            };
            if ts.spec.workspace.storage_class_name.is_some() {
                let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &ns);
                match pvcs
                    .create(&PostParams::default(), &workspace_claim(&ts, &ctx.config))
                    .await
                {
                    Ok(_) => {}
                    Err(kube::Error::Api(s)) if s.code == 409 => {}
                    Err(e) => return Err(kube_err("creating the workspace claim")(e)),
                }
            }
            let pp = PostParams {
                field_manager: Some(FIELD_MANAGER.into()),
                ..PostParams::default()
            };
            match pods.create(&pp, &pod).await {
                Ok(_) => info!(session = %name, "created the session pod"),
                Err(kube::Error::Api(s)) if s.code == 409 => {}
                Err(e) => return Err(kube_err("creating the session pod")(e)),
            }
            let st = ToolSessionStatus {
                phase: Some(SessionPhase::Pending),
                pod_name: Some(name.clone()),
                ..ToolSessionStatus::default()
            };
            write_status(&sessions, &ts, st).await?;
            Ok(Action::requeue(RESYNC))
        }
        SessionDecision::Bind(warm) => {
            let st = ToolSessionStatus {
                phase: Some(SessionPhase::Pending),
                pod_name: Some(warm.clone()),
                message: Some(format!("taking warm pod {warm}")),
                ..ToolSessionStatus::default()
            };
            write_status(&sessions, &ts, st).await?;
            debug!(session = %name, pod = %warm, "bound to a warm session pod");
            Ok(Action::requeue(Duration::from_secs(1)))
        }
        SessionDecision::Claim {
            pod,
            resource_version,
        } => {
            let tenant = ts.labels().get(labels::TENANT).cloned().unwrap_or_default();
            let patch = serde_json::json!({
                "metadata": {
                    "resourceVersion": resource_version,
                    "labels": {
                        labels::SESSION: labels::label_value(&name),
                        labels::TENANT: tenant,
                        // Warm pods carry it; set again so that no claim can drop it.
                        labels::SANDBOX: labels::SANDBOX_VALUE,
                        labels::WARM_POOL: null,
                        warmpool::SPEC_HASH: null,
                    },
                    "ownerReferences": [owner(&ts)],
                }
            });
            let pp = PatchParams {
                field_manager: Some(FIELD_MANAGER.into()),
                ..PatchParams::default()
            };
            match pods.patch(&pod, &pp, &Patch::Merge(&patch)).await {
                Ok(_) => {
                    info!(session = %name, %pod, "took a warm session pod");
                    ctx.metrics.warm_bound.inc();
                }
                // Changed (looked at again), taken or gone (a pod of its own next).
                Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => {
                    debug!(session = %name, %pod, code = s.code, "the warm pod changed, was taken or is gone");
                }
                Err(e) => return Err(kube_err("claiming the warm session pod")(e)),
            }
            Ok(Action::requeue(Duration::from_millis(200)))
        }
        SessionDecision::DeletePod(p) => {
            ctx.delete_pod(&p).await?;
            Ok(Action::requeue(Duration::from_secs(1)))
        }
        SessionDecision::Isolate(p) => {
            let patch = serde_json::json!({
                "metadata": { "labels": { labels::SANDBOX: labels::SANDBOX_VALUE } }
            });
            let pp = PatchParams {
                field_manager: Some(FIELD_MANAGER.into()),
                ..PatchParams::default()
            };
            match pods.patch(&p, &pp, &Patch::Merge(&patch)).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(kube_err("labelling the session pod")(e)),
            }
            warn!(session = %name, pod = %p, "the session pod lacked the sandbox label (the deny-all NetworkPolicy did not select it): label restored");
            ctx.event(
                ts.as_ref(),
                EventType::Warning,
                "Isolated",
                format!(
                    "pod {p} lacked the {} label, so the deny-all NetworkPolicy did not select \
                     it; the label is restored",
                    labels::SANDBOX
                ),
            )
            .await;
            Ok(Action::requeue(Duration::from_millis(200)))
        }
        SessionDecision::Status(st) => {
            if st.phase == Some(SessionPhase::Failed) {
                warn!(session = %name, message = ?st.message, "session failed");
            }
            write_status(&sessions, &ts, st).await?;
            Ok(Action::requeue(Duration::from_secs(1)))
        }
        SessionDecision::Wait(d) => {
            let until_expiry = expires_at(&ts)
                .map(|e| (e.as_millisecond() - Timestamp::now().as_millisecond()).max(0) as u64)
                .map(Duration::from_millis)
                .unwrap_or(d);
            Ok(Action::requeue(
                d.min(until_expiry + Duration::from_millis(200)),
            ))
        }
    }
}

/// The session's ToolRuns not finished yet.
async fn runs_in_flight(ts: &ToolSession, ctx: &Context) -> Result<usize, Error> {
    let runs: Api<toolrun_crd::ToolRun> =
        Api::namespaced(ctx.client.clone(), &ctx.config.namespace);
    let lp = kube::api::ListParams::default().labels(&format!(
        "{}={}",
        labels::SESSION,
        labels::label_value(&ts.name_any())
    ));
    let list = runs
        .list(&lp)
        .await
        .map_err(kube_err("listing the session's ToolRuns"))?;
    Ok(list
        .items
        .iter()
        .filter(|r| {
            !r.status
                .as_ref()
                .and_then(|s| s.phase)
                .is_some_and(|p| p.is_finished())
        })
        .count())
}

/// Applies `st` with the times added (see [`crate::reconcile::apply_status`]).
async fn write_status(
    sessions: &Api<ToolSession>,
    ts: &ToolSession,
    mut st: ToolSessionStatus,
) -> Result<(), Error> {
    st.last_activity = last_activity(ts).map(Time);
    st.expires_at = expires_at(ts).map(Time);
    st.observed_generation = ts.metadata.generation;
    apply_status(sessions, ts, &st).await?;
    Ok(())
}

fn error_policy(ts: Arc<ToolSession>, e: &Error, ctx: Arc<Context>) -> Action {
    ctx.session_backoff.retry(ts.as_ref(), e)
}

/// Reconciles ToolSessions until `stop` (one term of leadership).
pub async fn run(ctx: Arc<Context>, stop: tokio_util::sync::CancellationToken) {
    let ns = ctx.config.namespace.clone();
    let sessions: Api<ToolSession> = Api::namespaced(ctx.client.clone(), &ns);
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    Controller::new(sessions, watcher::Config::default())
        .owns(pods, watcher::Config::default().labels(labels::SESSION))
        .with_config(RuntimeConfig::default().concurrency(8))
        .graceful_shutdown_on(stop.cancelled_owned())
        .run(reconcile, error_policy, ctx)
        .for_each(|_| async {})
        .await;
}

#[cfg(test)]
mod tests;
