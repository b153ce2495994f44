//! What to do about a ToolRun, decided from what is observed: the pure half of the
//! reconciler.
//!
//! [`decide`] looks at the ToolRun (the watch cache's copy, or one GET when this operator
//! has written or read a newer version than the cache holds), the pod of its current
//! attempt (read with a GET, `None` when there is none) and the clock, and returns
//! one [`Decision`]; the controller carries it out and looks again. Nothing here does IO,
//! so every branch is unit tested.
//!
//! ## Attempts, retries and restarts
//! The pod of a run is named after the ToolRun (`<name>`), so a restarted operator finds
//! it by name and creating it again answers AlreadyExists: one pod per attempt, however
//! often the operator dies. `status.podName` is written only after the pod was created;
//! a pod that is missing while `status.podName` names it was therefore lost (deleted,
//! evicted, its node gone).
//!
//! A pod lost before its program started (still pending, or failed with an eviction-like
//! reason before the run container ran) is retried **once**, as `<name>-retry`. The retry
//! is recorded in the status, as a `Retried` condition, *before* the second pod is
//! created: a restarted operator reads the condition, looks for `<name>-retry` and never
//! makes a third pod. A pod lost after its program started is not retried (the program
//! may have had effects; it is not ours to run twice): INFRA_ERROR.
//!
//! ## Warm pods: the binding is recorded before it is used
//! A one-shot run the warm pool can serve ([`warm_language`]) may, instead of a pod of its
//! own, bind to a ready warm pod (a pod whose agent waits for work; see
//! [`crate::warmpool`]). The steps, each a separate decision, and why each is safe when the
//! operator dies between two of them:
//! 1. [`Decision::Bind`]: the status names the pod (`podName`) with the condition
//!    `Bound=True` (reason `WarmPod`). Nothing is claimed yet.
//! 2. [`Decision::Claim`]: the pod is made the run's (owner reference and labels) by a
//!    patch that carries the pod's resourceVersion, so two runs cannot both claim one pod.
//!    A run whose bound pod is claimed by another, gone or not ready **unbinds**
//!    ([`Decision::Unbind`]: `Bound=False`, no `podName`) and takes the cold path; it never
//!    binds a second time.
//! 3. The status goes to Running (the request is about to be sent), then
//!    [`Decision::RunOnAgent`]: the request (id = the ToolRun's uid) is sent through the
//!    relay. The agent executes an id at most once, so a restarted operator that sends it
//!    again gets the same run's events and record, never a second execution.
//!
//! A bound run never unbinds once Running: from then on a lost pod is INFRA_ERROR as for a
//! cold pod whose program started. A warm pod is used once: it is deleted when the run is
//! finished.
//!
//! ## Finished runs
//! A finished status is never rewritten (the status write carries the resourceVersion
//! it was decided from, so a concurrent change makes it fail and the run is looked at
//! again). The pod of a finished run is kept, so its log stays readable, unless it is
//! still running (cancelled, or failed while pending): then it is deleted. When the TTL
//! since `completionTime` has passed, the ToolRun is deleted; its pod and ConfigMap go
//! with it through their owner references.

use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, ContainerStatus, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use toolrun_crd::{Phase, ToolRun, ToolRunStatus, Verdict};
use toolrun_runner::RunRecord;

use crate::config::OperatorConfig;
use crate::pods::{elapsed, is_ready_warm_pod, is_terminal, is_warm_pod, pending_problem};
use crate::toolrun::builders::{self, RUN_CONTAINER};

/// Condition type: the result is recorded (`True`) or not yet (`False`).
pub const READY: &str = "Ready";
/// Condition type: the first pod was lost before the program started and a second one
/// was made. Its presence is what stops a restarted operator from retrying twice.
pub const RETRIED: &str = "Retried";
/// Condition type: the run is bound to a warm pod (`True`, reason `WarmPod`) or gave its
/// binding up (`False`, reason `ClaimFailed`) and runs in a cold pod.
pub const BOUND: &str = "Bound";
/// Suffix of the retry pod's name.
pub const RETRY_SUFFIX: &str = "-retry";
/// How long to wait for a pod of the same name left by an earlier ToolRun of the same
/// name (the garbage collector removes it) before looking again.
pub const FOREIGN_POD_RECHECK: Duration = Duration::from_secs(2);
/// Pod status reasons that mean the node or the kubelet gave up on the pod, not the
/// program: such a pod whose program never started is retried.
const LOST_REASONS: &[&str] = &[
    "Evicted",
    "Preempting",
    "NodeLost",
    "NodeShutdown",
    "Shutdown",
    "Terminated",
    "UnexpectedAdmissionError",
];
/// One step of the reconciler.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Ensure the ConfigMap, create the pod (AlreadyExists is success), then record
    /// Pending with `status.podName`.
    CreatePod {
        /// The run's ConfigMap.
        config_map: Box<ConfigMap>,
        /// The pod of this attempt.
        pod: Box<Pod>,
    },
    /// Record progress (Pending or Running) without a result.
    Progress {
        /// Pending or Running.
        phase: Phase,
        /// The current pod.
        pod_name: String,
        /// When the run container started (Running only).
        start_time: Option<Time>,
    },
    /// The pod finished: read the run container's log (when it ever ran) and record
    /// the runner's result.
    ReadLog {
        /// The finished pod.
        pod_name: String,
        /// The run container ran; otherwise there is no log to read.
        started: bool,
    },
    /// The runner's record was read from the live log of the current pod (see
    /// [`crate::toolrun::follow`]): record it as [`Decision::ReadLog`] would from the finished
    /// pod, without waiting for the kubelet to notice the exit.
    Record {
        /// The pod whose log it was read from.
        pod_name: String,
        /// The record.
        record: Box<RunRecord>,
    },
    /// Record a result that needs nothing more (cancelled, infrastructure error), then
    /// delete the pod when it is named.
    Finish {
        /// The result (phase, verdict, reason; times and conditions are added).
        status: Box<ToolRunStatus>,
        /// Pod to delete after recording.
        delete_pod: Option<String>,
    },
    /// Record the retry (the `Retried` condition), then create the second pod.
    Retry {
        /// Why the first pod is gone.
        reason: String,
        /// Name of the second pod.
        next_pod: String,
    },
    /// Delete a pod that still runs although its run is finished.
    DeletePod {
        /// The pod.
        name: String,
    },
    /// The TTL has passed: delete the ToolRun (children go with it).
    DeleteRun,
    /// Record the binding to a ready warm pod (`podName`, `Bound=True`) before claiming it.
    Bind {
        /// The warm pod.
        pod_name: String,
    },
    /// Claim the bound warm pod: owner reference and labels, patched with the pod's
    /// resourceVersion (a conflict means another run took it).
    Claim {
        /// The warm pod.
        pod_name: String,
        /// The resourceVersion it was seen unclaimed at.
        resource_version: String,
    },
    /// Give the warm binding up before anything was sent (`Bound=False`, no `podName`);
    /// the run continues on the cold path.
    Unbind {
        /// Why.
        reason: String,
        /// A claimed pod of this run that cannot be used: delete it.
        delete_pod: Option<String>,
    },
    /// The run is Running on its claimed warm pod: make sure its request is (or is being)
    /// carried out through the relay; the record comes back as a live record.
    RunOnAgent {
        /// The warm pod.
        pod_name: String,
    },
    /// Nothing to do now: look again after this long, or when something changes.
    Wait(Option<Duration>),
}

/// What the warm pool offers a run, observed by the controller.
#[derive(Debug, Clone, Copy, Default)]
pub struct Warm<'a> {
    /// A ready, unclaimed warm pod of the run's language: offered only to a run that
    /// [`warm_language`] accepts and that has no pod yet.
    pub candidate: Option<&'a Pod>,
    /// Why carrying the run's request to its bound pod's agent failed (unreachable after
    /// the relay's retries, or a protocol error).
    pub failure: Option<&'a str>,
    /// A run in a session (`spec.session`) not bound yet: `Err` with why the session cannot
    /// take it (missing, another tenant's, failed), `Ok` while it is starting; its Ready
    /// pod comes as `candidate`.
    pub session: Option<Result<(), &'a str>>,
}

/// The pod serves `run`'s session (`spec.session`).
pub fn is_session_pod_of(pod: &Pod, run: &ToolRun) -> bool {
    run.spec.session.as_deref().is_some_and(|s| {
        pod.labels()
            .get(toolrun_crd::labels::SESSION)
            .map(String::as_str)
            == Some(s)
            && pod
                .owner_references()
                .iter()
                .any(|o| o.kind == "ToolSession" && o.controller == Some(true) && o.name == s)
    })
}

/// The language whose warm pool may serve `run`, if any: a pool is configured for it and
/// the run needs nothing a warm pod lacks (the pod's own resources and RuntimeClass are
/// the defaults; everything else, the timeout and output bounds included, is in the
/// request).
pub fn warm_language<'r>(run: &'r ToolRun, config: &OperatorConfig) -> Option<&'r str> {
    let language = run.spec.language.as_str();
    // An image run needs its own image: never a warm pod's.
    let image_run = run.spec.image.is_some();
    // A session's run goes to the session's pod: offering it a one-shot pod would only
    // hold that pod back from other runs (and delay this one).
    let in_session = run.spec.session.is_some();
    if config.warm_pool.get(language).copied().unwrap_or(0) == 0
        || run.spec.cancel
        || image_run
        || in_session
    {
        return None;
    }
    let limits = builders::resolve_limits(&run.spec.limits, config).ok()?;
    let defaults = config.default_limits;
    let same_pod = limits.memory_mib == defaults.memory_mib
        && limits.cpu_millis == defaults.cpu_millis
        && builders::runtime_class(run, config).ok()? == config.runtime_class_name;
    same_pod.then_some(language)
}

/// The run is bound to a warm pod (`Bound=True`).
pub fn is_bound(status: Option<&ToolRunStatus>) -> bool {
    condition_is(status, BOUND, "True")
}

fn condition_is(status: Option<&ToolRunStatus>, type_: &str, value: &str) -> bool {
    status.is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == type_ && c.status == value)
    })
}

/// Name of the pod of `attempt` (0 or 1) of the run `run_name`.
pub fn pod_name(run_name: &str, attempt: u32) -> String {
    if attempt == 0 {
        run_name.to_string()
    } else {
        format!("{run_name}{RETRY_SUFFIX}")
    }
}

/// The attempt the status says is current: 1 after a retry, else 0.
pub fn attempt(status: Option<&ToolRunStatus>) -> u32 {
    u32::from(condition_is(status, RETRIED, "True"))
}

/// The name of the pod the run's current attempt uses: the bound warm pod, else the pod
/// named after the run (or its retry).
pub fn current_pod_name(run: &ToolRun) -> String {
    let status = run.status.as_ref();
    if is_bound(status)
        && let Some(p) = status.and_then(|s| s.pod_name.clone())
    {
        return p;
    }
    pod_name(&run.name_any(), attempt(status))
}

/// What to do next about `run`, whose current pod is `pod`, at `now`; `live_record` is the
/// runner's record when it was already read from that pod's live log (the caller matches
/// it to the pod by UID).
pub fn decide(
    run: &ToolRun,
    pod: Option<&Pod>,
    live_record: Option<&RunRecord>,
    warm: Warm<'_>,
    now: Timestamp,
    config: &OperatorConfig,
    pending_grace: Duration,
) -> Decision {
    let empty = ToolRunStatus::default();
    let status = run.status.as_ref().unwrap_or(&empty);
    let name = run.name_any();
    let attempt = attempt(Some(status));
    let pod_name = pod_name(&name, attempt);

    if status.phase.is_some_and(Phase::is_finished) {
        return decide_finished(run, status, pod, now, config);
    }
    if is_bound(Some(status)) {
        return decide_bound(run, status, pod, live_record, warm.failure, now);
    }
    if let Some(session) = &run.spec.session {
        // A session's run goes to the session's pod, never to a pod of its own.
        if run.spec.cancel {
            return finish(cancelled(), None);
        }
        if let Some(c) = warm.candidate
            && is_session_pod_of(c, run)
        {
            return Decision::Bind {
                pod_name: c.name_any(),
            };
        }
        return match warm.session {
            Some(Err(why)) => finish(infra(format!("session {session}: {why}")), None),
            _ => Decision::Wait(Some(Duration::from_secs(1))),
        };
    }
    if let Some(p) = pod
        && !is_owned_by(p, run)
    {
        // An earlier ToolRun of the same name left it and the garbage collector will
        // remove it; anything else is not ours to touch.
        let left_by_a_toolrun = p.owner_references().iter().any(|o| {
            o.kind == "ToolRun" && o.api_version.starts_with("toolrun.dev/") && o.name == name
        });
        if left_by_a_toolrun || p.metadata.deletion_timestamp.is_some() {
            return Decision::Wait(Some(FOREIGN_POD_RECHECK));
        }
        return finish(
            infra(format!(
                "a pod named {pod_name} already exists and does not belong to this ToolRun"
            )),
            None,
        );
    }
    if let (Some(_), Some(record)) = (pod, live_record) {
        // The runner wrote its record and is exiting: the run is over, whatever the
        // kubelet shows yet. As with a finished pod, an unrecorded cancel comes too late.
        return Decision::Record {
            pod_name,
            record: Box::new(record.clone()),
        };
    }
    let terminal = pod.is_some_and(is_terminal);
    if run.spec.cancel && !terminal {
        let cancelled = cancelled();
        let delete = pod
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .map(|_| pod_name.clone());
        return finish(cancelled, delete);
    }
    let Some(pod) = pod else {
        if status.pod_name.as_deref() == Some(pod_name.as_str()) {
            let started = status.phase == Some(Phase::Running);
            return lost(&name, &pod_name, attempt, started, "disappeared");
        }
        // At most one warm binding per run: never after an unbinding or a retry.
        let never_bound = status.pod_name.is_none()
            && attempt == 0
            && !status.conditions.iter().any(|c| c.type_ == BOUND);
        if never_bound
            && let Some(candidate) = warm.candidate
            && warm_language(run, config).is_some()
            && candidate.labels().get(toolrun_crd::labels::WARM_POOL) == Some(&run.spec.language)
            && is_ready_warm_pod(candidate)
        {
            return Decision::Bind {
                pod_name: candidate.name_any(),
            };
        }
        return match (
            builders::config_map(run, config),
            builders::pod(run, config),
        ) {
            (Ok(config_map), Ok(mut pod)) => {
                pod.metadata.name = Some(pod_name);
                Decision::CreatePod {
                    config_map: Box::new(config_map),
                    pod: Box::new(pod),
                }
            }
            (Err(e), _) | (_, Err(e)) => finish(infra(format!("invalid ToolRun: {e}")), None),
        };
    };
    let started = run_container_started(pod);
    if terminal {
        let reason = pod.status.as_ref().and_then(|s| s.reason.as_deref());
        if !started && reason.is_some_and(|r| LOST_REASONS.contains(&r) || r.starts_with("OutOf")) {
            let why = format!("failed ({})", reason.unwrap_or_default());
            return lost(&name, &pod_name, attempt, false, &why);
        }
        return Decision::ReadLog { pod_name, started };
    }
    if pod.metadata.deletion_timestamp.is_some() {
        return lost(&name, &pod_name, attempt, started, "was deleted");
    }
    if started {
        if status.phase != Some(Phase::Running) || status.pod_name.as_deref() != Some(&pod_name) {
            return Decision::Progress {
                phase: Phase::Running,
                pod_name,
                start_time: Some(run_container_start(pod).unwrap_or(Time(now))),
            };
        }
        return Decision::Wait(None);
    }
    if let Some(problem) = pending_problem(pod) {
        let age = elapsed(pod.metadata.creation_timestamp.as_ref(), now);
        return if age >= pending_grace {
            finish(infra(problem), Some(pod_name))
        } else {
            Decision::Wait(Some(pending_grace - age))
        };
    }
    if status.phase != Some(Phase::Pending) || status.pod_name.as_deref() != Some(&pod_name) {
        return Decision::Progress {
            phase: Phase::Pending,
            pod_name,
            start_time: None,
        };
    }
    Decision::Wait(None)
}

/// Whether to follow the `run` container's log of `pod` (see [`crate::toolrun::follow`]): it is
/// the run's current pod, its program runs as far as the kubelet said, the run is neither
/// finished nor cancelled, and no record was read yet.
pub fn follow_log(run: &ToolRun, pod: &Pod, live_record: Option<&RunRecord>) -> bool {
    let finished = run
        .status
        .as_ref()
        .and_then(|s| s.phase)
        .is_some_and(Phase::is_finished);
    live_record.is_none()
        && !finished
        && !run.spec.cancel
        && pod.metadata.name.as_deref() == Some(current_pod_name(run).as_str())
        && is_owned_by(pod, run)
        && pod.metadata.deletion_timestamp.is_none()
        && !is_terminal(pod)
        && run_container_started(pod)
}

/// A run bound to a warm pod and not finished (see the module docs for the steps).
fn decide_bound(
    run: &ToolRun,
    status: &ToolRunStatus,
    pod: Option<&Pod>,
    live_record: Option<&RunRecord>,
    failure: Option<&str>,
    now: Timestamp,
) -> Decision {
    let bound = status.pod_name.clone().unwrap_or_default();
    // Running is written before the request is sent: before it, nothing ran.
    let sent = status.phase == Some(Phase::Running);
    let unbind =
        |reason: String, delete_pod: Option<String>| Decision::Unbind { reason, delete_pod };
    let in_session = run.spec.session.is_some();
    let Some(p) = pod else {
        return if sent {
            finish(
                infra(format!(
                    "warm pod {bound} disappeared while the program ran (not retried: the \
                     program had started)"
                )),
                None,
            )
        } else if run.spec.cancel {
            finish(cancelled(), None)
        } else if in_session {
            finish(infra(format!("session pod {bound} is gone")), None)
        } else {
            unbind(format!("warm pod {bound} is gone"), None)
        };
    };
    if !is_owned_by(p, run) && !is_session_pod_of(p, run) {
        if run.spec.cancel {
            return finish(cancelled(), None);
        }
        if sent {
            return finish(
                infra(format!("warm pod {bound} no longer belongs to this run")),
                None,
            );
        }
        if is_ready_warm_pod(p)
            && let Some(rv) = p.metadata.resource_version.clone()
        {
            return Decision::Claim {
                pod_name: bound,
                resource_version: rv,
            };
        }
        return unbind(
            format!("warm pod {bound} was taken by another run or is not ready"),
            None,
        );
    }
    let going = p.metadata.deletion_timestamp.is_some();
    // A session's pod is the session's: never deleted for one of its runs.
    let ours = !in_session;
    if run.spec.cancel {
        let delete = (ours && !going && !is_terminal(p)).then(|| bound.clone());
        return finish(cancelled(), delete);
    }
    if let Some(record) = live_record {
        return Decision::Record {
            pod_name: bound,
            record: Box::new(record.clone()),
        };
    }
    if let Some(why) = failure {
        let delete = (ours && !going).then(|| bound.clone());
        return finish(
            infra(format!("the agent of warm pod {bound} failed: {why}")),
            delete,
        );
    }
    if going || is_terminal(p) {
        let how = if going { "was deleted" } else { "stopped" };
        if sent {
            return finish(
                infra(format!(
                    "warm pod {bound} {how} while the program ran (not retried: the program \
                     had started)"
                )),
                None,
            );
        }
        let delete = (!going).then(|| bound.clone());
        return unbind(
            format!("warm pod {bound} {how} before the run was sent"),
            delete,
        );
    }
    if !sent {
        return Decision::Progress {
            phase: Phase::Running,
            pod_name: bound,
            start_time: Some(Time(now)),
        };
    }
    Decision::RunOnAgent { pod_name: bound }
}

fn cancelled() -> ToolRunStatus {
    ToolRunStatus {
        phase: Some(Phase::Failed),
        verdict: Some(Verdict::Cancelled),
        reason: Some("cancelled (spec.cancel)".into()),
        ..ToolRunStatus::default()
    }
}

fn decide_finished(
    run: &ToolRun,
    status: &ToolRunStatus,
    pod: Option<&Pod>,
    now: Timestamp,
    config: &OperatorConfig,
) -> Decision {
    // A pod still running after a result recorded without the runner (cancelled,
    // infrastructure error) is stopped. After a runner's record (read from the live log)
    // the runner is exiting by itself: its pod is kept, so its log stays readable.
    let without_runner = matches!(
        status.verdict,
        None | Some(Verdict::Cancelled | Verdict::InfraError)
    );
    // A warm pod is used once: its agent keeps running after the record, so it goes now.
    if let Some(p) = pod
        && (without_runner || is_warm_pod(p))
        && is_owned_by(p, run)
        && !is_terminal(p)
        && p.metadata.deletion_timestamp.is_none()
    {
        return Decision::DeletePod { name: p.name_any() };
    }
    let ttl = Duration::from_secs(builders::ttl_seconds_after_finished(run, config).into());
    let finished_at = status
        .completion_time
        .as_ref()
        .or(run.metadata.creation_timestamp.as_ref());
    let age = elapsed(finished_at, now);
    if age >= ttl {
        Decision::DeleteRun
    } else {
        Decision::Wait(Some(ttl - age))
    }
}

/// The pod of the current attempt is gone (or going) without a result.
fn lost(run_name: &str, pod_name: &str, attempt: u32, started: bool, how: &str) -> Decision {
    if started {
        return finish(
            infra(format!(
                "pod {pod_name} {how} while the program ran (not retried: the program had started)"
            )),
            None,
        );
    }
    if attempt == 0 {
        return Decision::Retry {
            reason: format!("pod {pod_name} {how} before the program started"),
            next_pod: self::pod_name(run_name, 1),
        };
    }
    finish(
        infra(format!(
            "pod {pod_name} {how} before the program started, after one retry"
        )),
        None,
    )
}

fn finish(status: ToolRunStatus, delete_pod: Option<String>) -> Decision {
    Decision::Finish {
        status: Box::new(status),
        delete_pod,
    }
}

/// An INFRA_ERROR result with `reason`.
pub fn infra(reason: String) -> ToolRunStatus {
    ToolRunStatus {
        phase: Some(Phase::Failed),
        verdict: Some(Verdict::InfraError),
        reason: Some(reason),
        ..ToolRunStatus::default()
    }
}

/// The pod's controller owner reference is this ToolRun (same uid).
pub fn is_owned_by(pod: &Pod, run: &ToolRun) -> bool {
    let uid = run.metadata.uid.as_deref();
    uid.is_some()
        && pod
            .owner_references()
            .iter()
            .any(|o| o.controller == Some(true) && Some(o.uid.as_str()) == uid)
}

fn run_container(pod: &Pod) -> Option<&ContainerStatus> {
    pod.status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .iter()
        .find(|c| c.name == RUN_CONTAINER)
}

/// The run container has run (is running or has terminated): the program started.
pub fn run_container_started(pod: &Pod) -> bool {
    run_container(pod).is_some_and(|c| {
        let now = c
            .state
            .as_ref()
            .is_some_and(|s| s.running.is_some() || s.terminated.is_some());
        let before = c
            .last_state
            .as_ref()
            .is_some_and(|s| s.terminated.is_some());
        now || before
    })
}

/// When the run container started (running or terminated state).
pub fn run_container_start(pod: &Pod) -> Option<Time> {
    let state = run_container(pod)?.state.as_ref()?;
    state
        .running
        .as_ref()
        .and_then(|r| r.started_at.clone())
        .or_else(|| state.terminated.as_ref().and_then(|t| t.started_at.clone()))
}

/// The complete status to write: `new` (phase, verdict, result) with the times, pod name,
/// observedGeneration and conditions filled in from `run`'s current status and `now`.
pub fn compose_status(run: &ToolRun, mut new: ToolRunStatus, now: Timestamp) -> ToolRunStatus {
    let empty = ToolRunStatus::default();
    let old = run.status.as_ref().unwrap_or(&empty);
    let finished = new.phase.is_some_and(Phase::is_finished);
    if finished {
        if new.pod_name.is_none() {
            new.pod_name = old.pod_name.clone();
        }
        if new.start_time.is_none() {
            new.start_time = old.start_time.clone();
        }
        new.completion_time = Some(Time(now));
    } else if new.phase == Some(Phase::Running) && new.start_time.is_none() {
        new.start_time = old.start_time.clone();
    }
    new.observed_generation = run.metadata.generation;

    let (ready_status, ready_reason, ready_message) = match (new.phase, new.verdict) {
        (Some(p), Some(v)) if p.is_finished() => (
            "True",
            camel(v.as_str()),
            new.reason
                .clone()
                .unwrap_or_else(|| format!("verdict {}", v.as_str())),
        ),
        (Some(Phase::Running), _) => ("False", "Running".into(), "the program is running".into()),
        _ => (
            "False",
            "Pending".into(),
            "waiting for the pod to run".into(),
        ),
    };
    let old_ready = old.conditions.iter().find(|c| c.type_ == READY);
    let transition = match old_ready {
        Some(c) if c.status == ready_status => c.last_transition_time.clone(),
        _ => Time(now),
    };
    let ready = Condition {
        type_: READY.into(),
        status: ready_status.into(),
        reason: ready_reason,
        message: ready_message,
        observed_generation: run.metadata.generation,
        last_transition_time: transition,
    };
    // Retried and Bound are written once, by the decision that sets them, and kept after.
    let kept: Vec<Condition> = [RETRIED, BOUND]
        .into_iter()
        .filter_map(|t| {
            new.conditions
                .iter()
                .find(|c| c.type_ == t)
                .or_else(|| old.conditions.iter().find(|c| c.type_ == t))
                .cloned()
        })
        .collect();
    new.conditions = std::iter::once(ready).chain(kept).collect();
    new
}

/// The `Bound` condition: `True` when binding to a warm pod, `False` when giving it up.
pub fn bound_condition(run: &ToolRun, bound: bool, message: &str, now: Timestamp) -> Condition {
    Condition {
        type_: BOUND.into(),
        status: if bound { "True" } else { "False" }.into(),
        reason: match (bound, run.spec.session.is_some()) {
            (true, true) => "SessionPod",
            (true, false) => "WarmPod",
            (false, _) => "ClaimFailed",
        }
        .into(),
        message: message.to_string(),
        observed_generation: run.metadata.generation,
        last_transition_time: Time(now),
    }
}

/// The `Retried` condition recorded before the second pod is made.
pub fn retried_condition(run: &ToolRun, reason: &str, now: Timestamp) -> Condition {
    Condition {
        type_: RETRIED.into(),
        status: "True".into(),
        reason: "PodLost".into(),
        message: reason.to_string(),
        observed_generation: run.metadata.generation,
        last_transition_time: Time(now),
    }
}

/// `RUNTIME_ERROR` -> `RuntimeError` (condition reasons are CamelCase).
fn camel(screaming: &str) -> String {
    screaming
        .split('_')
        .map(|w| {
            let mut cs = w.chars();
            cs.next()
                .map(|f| f.to_ascii_uppercase().to_string() + &cs.as_str().to_ascii_lowercase())
                .unwrap_or_default()
        })
        .collect()
}

#[cfg(test)]
mod tests;
