//! The controller: watches ToolRuns in the sandbox namespace (and the pods and
//! ConfigMaps it made for them), and carries out what [`crate::toolrun::decide`] decides.
//!
//! Each reconcile takes the ToolRun from the watch cache, unless this process has written
//! or read a newer version of it than the cache holds (the cache lags behind our own
//! writes): then it reads it with one GET ([`crate::reconcile::Fresh`]). The run's current
//! pod is read with a GET. It decides one step, does it and returns.
//! Status writes are server-side applies of the whole status to the status subresource
//! ([`crate::reconcile::apply_status`]), carrying the resourceVersion that was read:
//! if anything changed meanwhile the write fails and the run is looked at again, so a
//! finished status is never overwritten. Pods are created with POST (AlreadyExists is
//! success: a restarted operator finds the pod it made); ConfigMaps are applied once.
//!
//! While a run's program runs, its pod's `run` container log is followed
//! ([`crate::toolrun::follow`]); the record read there triggers a reconcile (through
//! `Controller::reconcile_on`) that records it before the kubelet reports the pod
//! finished. Only the leader runs the controller, so only the leader follows logs; the
//! followers stop with its term.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, LogParams, Patch, PatchParams, PostParams, PropagationPolicy};
use kube::runtime::controller::{Action, Config as RuntimeConfig, Controller};
use kube::runtime::events::EventType;
use kube::runtime::watcher;
use kube::{Api, Resource, ResourceExt};
use toolrun_crd::{Phase, ToolRun, ToolRunStatus, Verdict, labels};
use tracing::{debug, info, warn};

use crate::metrics::VerdictLabels;
use crate::reconcile::{Context, Error, FIELD_MANAGER, apply_status, kube_err};
use crate::toolrun::builders::{self, RUN_CONTAINER};
use crate::toolrun::decide::{self, Decision};
use crate::toolrun::follow;
use crate::toolrun::record::{RecordError, record_from_log};
use crate::toolrun::status::{finished_status, status_without_record};
use crate::warmpool;

/// A run whose state changes only through watched objects is still looked at this often.
const RESYNC: Duration = Duration::from_secs(300);
/// Backoff after failed reconciles: doubling from the first up to the second.
pub const BACKOFF: (Duration, Duration) = (Duration::from_millis(500), Duration::from_secs(60));

/// Drops what this process keeps for the run `name` (deleted, or gone).
fn forget(ctx: &Context, name: &str) {
    ctx.fresh_runs.forget(name);
    ctx.followers.forget_run(name);
    ctx.agent_runs.forget_run(name);
}

/// Runs the controller until `stop` resolves, then lets in-flight reconciles finish.
pub async fn run_controller(
    ctx: Arc<Context>,
    concurrency: u16,
    stop: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let selector = format!("{}={}", labels::MANAGED_BY, labels::MANAGED_BY_VALUE);
    let children = watcher::Config::default().labels(&selector);
    let records_read =
        futures::stream::select(ctx.followers.start_term(), ctx.agent_runs.start_term());
    let followers = ctx.followers.clone();
    let agent_runs = ctx.agent_runs.clone();
    let controller = Controller::new(ctx.api::<ToolRun>(), watcher::Config::default());
    ctx.fresh_runs.set_store(controller.store());
    controller
        .owns(ctx.api::<Pod>(), children.clone())
        .owns(ctx.api::<ConfigMap>(), children)
        .reconcile_on(records_read)
        .with_config(RuntimeConfig::default().concurrency(concurrency))
        .graceful_shutdown_on(stop)
        .run(reconcile, error_policy, ctx)
        .for_each(|res| async move {
            match res {
                Ok((obj, _)) => debug!(run = %obj.name, "reconciled"),
                Err(e) => debug!(error = %e, "reconcile failed"),
            }
        })
        .await;
    followers.end_term();
    agent_runs.end_term();
}

/// One reconcile of one ToolRun.
pub async fn reconcile(cached: Arc<ToolRun>, ctx: Arc<Context>) -> Result<Action, Error> {
    let name = cached
        .metadata
        .name
        .clone()
        .ok_or(Error::Metadata("name"))?;
    let result = reconcile_inner(&cached, &name, &ctx).await;
    ctx.metrics.reconciled(result.is_ok());
    if result.is_ok() {
        ctx.run_backoff.succeeded(&name);
    }
    result
}

/// Requeues a failed run with exponential backoff.
pub fn error_policy(run: Arc<ToolRun>, error: &Error, ctx: Arc<Context>) -> Action {
    ctx.run_backoff.retry(run.as_ref(), error)
}

async fn reconcile_inner(cached: &ToolRun, name: &str, ctx: &Context) -> Result<Action, Error> {
    let Some(run) = ctx.fresh_runs.get(&ctx.api(), name, cached).await? else {
        return Ok(Action::await_change());
    };
    if run.metadata.deletion_timestamp.is_some() {
        forget(ctx, name);
        return Ok(Action::await_change());
    }
    let finished = run
        .status
        .as_ref()
        .and_then(|s| s.phase)
        .is_some_and(Phase::is_finished);
    if finished {
        ctx.followers.forget_run(name);
        ctx.agent_runs.forget_run(name);
    }
    let pod_name = decide::current_pod_name(&run);
    let pod = ctx
        .api::<Pod>()
        .get_opt(&pod_name)
        .await
        .map_err(kube_err(format!("reading pod {pod_name}")))?;
    // A record read from this very pod's live log (matched by UID: never another
    // attempt's, never an earlier ToolRun's of the same name).
    let pod_uid = pod.as_ref().and_then(|p| p.metadata.uid.as_deref());
    let live_record = pod_uid.and_then(|uid| {
        ctx.followers
            .record(uid)
            .or_else(|| ctx.agent_runs.record(uid))
    });
    let failure = pod_uid.and_then(|uid| ctx.agent_runs.failure(uid));
    // A warm pod is offered only to a run that has none and may use one.
    let status = run.status.as_ref();
    let candidate = (pod.is_none()
        && !finished
        && status.and_then(|s| s.pod_name.as_ref()).is_none()
        && !status.is_some_and(|s| s.conditions.iter().any(|c| c.type_ == decide::BOUND)))
    .then(|| decide::warm_language(&run, &ctx.config))
    .flatten()
    .and_then(|lang| ctx.pool.pick(lang));
    // A run in a session not bound yet: the session's Ready pod, or why there is none.
    let (session_pod, session_view) =
        if run.spec.session.is_some() && !finished && !decide::is_bound(status) {
            session_of(&run, ctx).await?
        } else {
            (None, None)
        };
    let warm = decide::Warm {
        candidate: candidate.as_ref().or(session_pod.as_ref()),
        failure: failure.as_deref(),
        session: session_view
            .as_ref()
            .map(|r| r.as_ref().map(|_| ()).map_err(String::as_str)),
    };
    let decision = decide::decide(
        &run,
        pod.as_ref(),
        live_record.as_ref(),
        warm,
        Timestamp::now(),
        &ctx.config,
        ctx.pending_grace,
    );
    debug!(run = %name, ?decision, "decided");
    if let Some(p) = &pod
        && decide::follow_log(&run, p, live_record.as_ref())
        && let Ok(limits) = builders::resolve_limits(&run.spec.limits, &ctx.config)
    {
        ctx.followers.follow(
            &ctx.api::<Pod>(),
            name,
            p,
            follow::line_cap(limits.output_bytes),
        );
    }
    execute(&run, pod.as_ref(), decision, ctx).await
}

async fn execute(
    run: &ToolRun,
    pod: Option<&Pod>,
    decision: Decision,
    ctx: &Context,
) -> Result<Action, Error> {
    let name = run.name_any();
    match decision {
        Decision::CreatePod { config_map, pod } => create_pod(run, *config_map, *pod, ctx).await,
        Decision::Progress {
            phase,
            pod_name,
            start_time,
        } => {
            let status = ToolRunStatus {
                phase: Some(phase),
                pod_name: Some(pod_name.clone()),
                start_time,
                ..ToolRunStatus::default()
            };
            write_status(run, status, ctx).await?;
            if phase == Phase::Running {
                observe_since_creation(run, &ctx.metrics.start_seconds);
                ctx.event(
                    run,
                    EventType::Normal,
                    "Running",
                    format!("pod {pod_name} is running the program"),
                )
                .await;
            }
            Ok(Action::requeue(RESYNC))
        }
        Decision::ReadLog { pod_name, started } => {
            let pod = pod.expect("ReadLog is decided on an observed pod");
            let log = if started {
                read_log(ctx, &pod_name).await?
            } else {
                Err(RecordError::Empty)
            };
            let mut status = match log.and_then(|l| record_from_log(&l)) {
                Ok(record) => finished_status(&record, spec_json_bytes(run)),
                Err(why) => status_without_record(pod, &why),
            };
            if started {
                start_from_container(run, pod, &mut status, ctx);
            }
            finish(run, status, None, ctx).await
        }
        Decision::Record { pod_name, record } => {
            let pod = pod.expect("Record is decided on an observed pod");
            debug!(run = %name, pod = %pod_name, "recording the record read from the live log");
            let mut status = finished_status(&record, spec_json_bytes(run));
            start_from_container(run, pod, &mut status, ctx);
            finish(run, status, None, ctx).await
        }
        Decision::Finish { status, delete_pod } => {
            // A cancelled run in a session pod: the pod stays, the run is killed in it.
            let sent = run.status.as_ref().and_then(|s| s.phase) == Some(Phase::Running);
            if run.spec.session.is_some()
                && decide::is_bound(run.status.as_ref())
                && sent
                && status.verdict == Some(Verdict::Cancelled)
                && let (Some(pod_name), Some(uid)) = (
                    run.status.as_ref().and_then(|s| s.pod_name.clone()),
                    run.metadata.uid.clone(),
                )
            {
                let conn = ctx.relay_pool.get(&pod_name);
                tokio::spawn(async move {
                    let agent = crate::relay::Agent::from_connection(conn);
                    let req = toolrun_runner::agent::proto::Request {
                        id: agent.connection().new_id("kill"),
                        op: toolrun_runner::agent::proto::Op::Kill { target: uid },
                    };
                    if let Err(e) = agent.connection().call(req, |_| {}).await {
                        warn!(pod = %pod_name, error = %e, "killing a cancelled session run failed");
                    }
                });
            }
            finish(run, *status, delete_pod, ctx).await
        }
        Decision::Retry { reason, next_pod } => {
            let now = Timestamp::now();
            let status = ToolRunStatus {
                phase: Some(Phase::Pending),
                reason: Some(reason.clone()),
                conditions: vec![decide::retried_condition(run, &reason, now)],
                ..ToolRunStatus::default()
            };
            write_status(run, status, ctx).await?;
            info!(run = %name, %reason, %next_pod, "retrying once");
            ctx.event(
                run,
                EventType::Warning,
                "Retried",
                format!("{reason}; retrying once as pod {next_pod}"),
            )
            .await;
            Ok(Action::requeue(Duration::ZERO))
        }
        Decision::DeletePod { name: pod_name } => {
            ctx.delete_pod(&pod_name).await?;
            Ok(Action::requeue(Duration::from_secs(1)))
        }
        Decision::DeleteRun => {
            ctx.event(
                run,
                EventType::Normal,
                "Deleted",
                "ttlSecondsAfterFinished passed; deleting the ToolRun".into(),
            )
            .await;
            let dp = DeleteParams {
                propagation_policy: Some(PropagationPolicy::Background),
                preconditions: run
                    .metadata
                    .uid
                    .clone()
                    .map(|uid| kube::api::Preconditions {
                        uid: Some(uid),
                        resource_version: None,
                    }),
                ..DeleteParams::default()
            };
            match ctx.api::<ToolRun>().delete(&name, &dp).await {
                Ok(_) => info!(run = %name, "deleted after its TTL"),
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(kube_err(format!("deleting ToolRun {name}"))(e)),
            }
            forget(ctx, &name);
            Ok(Action::await_change())
        }
        Decision::Bind { pod_name } => {
            let now = Timestamp::now();
            let message = format!("bound to warm pod {pod_name}");
            let status = ToolRunStatus {
                phase: Some(Phase::Pending),
                pod_name: Some(pod_name.clone()),
                conditions: vec![decide::bound_condition(run, true, &message, now)],
                ..ToolRunStatus::default()
            };
            write_status(run, status, ctx).await?;
            debug!(run = %name, pod = %pod_name, "bound to a warm pod");
            ctx.metrics.warm_bound.inc();
            Ok(Action::requeue(Duration::ZERO))
        }
        Decision::Claim {
            pod_name,
            resource_version,
        } => {
            claim(run, &pod_name, &resource_version, ctx).await?;
            Ok(Action::requeue(Duration::ZERO))
        }
        Decision::Unbind {
            reason,
            delete_pod: leftover,
        } => {
            let now = Timestamp::now();
            let status = ToolRunStatus {
                phase: Some(Phase::Pending),
                reason: Some(reason.clone()),
                conditions: vec![decide::bound_condition(run, false, &reason, now)],
                ..ToolRunStatus::default()
            };
            write_status(run, status, ctx).await?;
            info!(run = %name, %reason, "gave the warm pod up: a pod of its own");
            ctx.metrics.warm_unbound.inc();
            if let Some(p) = leftover {
                ctx.delete_pod(&p).await?;
            }
            Ok(Action::requeue(Duration::ZERO))
        }
        Decision::RunOnAgent { pod_name } => {
            let pod = pod.expect("RunOnAgent is decided on an observed pod");
            let request = builders::run_spec(run, &ctx.config)
                .map_err(|e| format!("invalid ToolRun: {e}"))
                .and_then(|spec| {
                    warmpool::runs::request(run, spec).ok_or_else(|| "ToolRun without uid".into())
                });
            match request {
                Ok(request) => {
                    let conn = ctx.relay_pool.get(&pod_name);
                    if ctx.agent_runs.ensure(conn, &name, pod, request) {
                        debug!(run = %name, pod = %pod_name, "sent the run to the warm pod's agent");
                    }
                    Ok(Action::requeue(RESYNC))
                }
                Err(why) => finish(run, decide::infra(why), Some(pod_name), ctx).await,
            }
        }
        Decision::Wait(Some(after)) => Ok(Action::requeue(after.min(RESYNC))),
        Decision::Wait(None) => Ok(Action::requeue(RESYNC)),
    }
}

/// A short program can finish between two looks: when the run was never seen running,
/// its start comes from the container's own state (and is a start_seconds sample).
fn start_from_container(run: &ToolRun, pod: &Pod, status: &mut ToolRunStatus, ctx: &Context) {
    let seen_running = run.status.as_ref().and_then(|s| s.start_time.as_ref());
    if seen_running.is_some() {
        return;
    }
    status.start_time = decide::run_container_start(pod);
    if let (Some(start), Some(created)) = (&status.start_time, &run.metadata.creation_timestamp) {
        let ms = start.0.as_millisecond() - created.0.as_millisecond();
        ctx.metrics.start_seconds.observe(ms.max(0) as f64 / 1000.0);
    }
}

async fn create_pod(
    run: &ToolRun,
    config_map: ConfigMap,
    pod: Pod,
    ctx: &Context,
) -> Result<Action, Error> {
    let run_name = run.name_any();
    let cm_name = config_map.name_any();
    // The ConfigMap is immutable: apply it only when it is not there yet.
    match ctx
        .api::<ConfigMap>()
        .get_opt(&cm_name)
        .await
        .map_err(kube_err(format!("reading ConfigMap {cm_name}")))?
    {
        Some(existing) => {
            let ours = existing
                .owner_references()
                .iter()
                .any(|o| o.controller == Some(true) && Some(&o.uid) == run.metadata.uid.as_ref());
            if !ours {
                // Left by an earlier ToolRun of the same name: the garbage collector
                // removes it. Never adopt it.
                info!(run = %run_name, configmap = %cm_name, "waiting for a ConfigMap this run does not own to go");
                return Ok(Action::requeue(decide::FOREIGN_POD_RECHECK));
            }
        }
        None => {
            ctx.api::<ConfigMap>()
                .patch(
                    &cm_name,
                    &PatchParams::apply(FIELD_MANAGER),
                    &Patch::Apply(&config_map),
                )
                .await
                .map_err(kube_err(format!("applying ConfigMap {cm_name}")))?;
        }
    }
    let pod_name = pod.name_any();
    let pp = PostParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PostParams::default()
    };
    match ctx.api::<Pod>().create(&pp, &pod).await {
        Ok(_) => {
            info!(run = %run_name, pod = %pod_name, "created pod");
            ctx.event(
                run,
                EventType::Normal,
                "Created",
                format!("created pod {pod_name}"),
            )
            .await;
        }
        Err(kube::Error::Api(s)) if s.code == 409 => {
            debug!(run = %run_name, pod = %pod_name, "pod already exists");
        }
        Err(e) => return Err(kube_err(format!("creating pod {pod_name}"))(e)),
    }
    let status = ToolRunStatus {
        phase: Some(Phase::Pending),
        pod_name: Some(pod_name),
        ..ToolRunStatus::default()
    };
    write_status(run, status, ctx).await?;
    Ok(Action::requeue(RESYNC))
}

/// The session of a run with `spec.session`: its pod when Ready, `Err` when the session
/// cannot take the run (missing, another tenant's, failed), `Ok` while it starts.
async fn session_of(
    run: &ToolRun,
    ctx: &Context,
) -> Result<(Option<Pod>, Option<Result<(), String>>), Error> {
    use toolrun_crd::session::{SessionPhase, ToolSession};
    let name = run.spec.session.clone().unwrap_or_default();
    let sessions: Api<ToolSession> = Api::namespaced(ctx.client.clone(), &ctx.config.namespace);
    let Some(ts) = sessions
        .get_opt(&name)
        .await
        .map_err(kube_err(format!("reading ToolSession {name}")))?
    else {
        return Ok((None, Some(Err("no such ToolSession".into()))));
    };
    let tenant = |labels: &std::collections::BTreeMap<String, String>| {
        labels.get(labels::TENANT).cloned().unwrap_or_default()
    };
    if tenant(ts.labels()) != tenant(run.labels()) {
        return Ok((None, Some(Err("it belongs to another tenant".into()))));
    }
    let status = ts.status.unwrap_or_default();
    match (status.phase, status.pod_name) {
        (Some(SessionPhase::Ready), Some(pod)) => {
            let pod = ctx
                .api::<Pod>()
                .get_opt(&pod)
                .await
                .map_err(kube_err(format!("reading pod {pod}")))?;
            Ok((pod, Some(Ok(()))))
        }
        (Some(SessionPhase::Failed | SessionPhase::Closed), _) => Ok((
            None,
            Some(Err(status
                .message
                .unwrap_or_else(|| "the session ended".into()))),
        )),
        _ => Ok((None, Some(Ok(())))),
    }
}

/// Makes the warm pod `pod_name` the run's: its owner (so it goes with the run) and its
/// labels, by a merge patch carrying the resourceVersion it was seen unclaimed at. A
/// conflict or a missing pod is not an error: the next look unbinds the run.
async fn claim(
    run: &ToolRun,
    pod_name: &str,
    resource_version: &str,
    ctx: &Context,
) -> Result<(), Error> {
    let name = run.name_any();
    let uid = run.metadata.uid.clone().ok_or(Error::Metadata("uid"))?;
    let patch = serde_json::json!({
        "metadata": {
            "resourceVersion": resource_version,
            "labels": {
                labels::RUN: labels::label_value(&name),
                labels::CALL_ID: labels::label_value(run.call_id()),
            },
            "ownerReferences": [{
                "apiVersion": ToolRun::api_version(&()),
                "kind": ToolRun::kind(&()),
                "name": name,
                "uid": uid,
                "controller": true,
                "blockOwnerDeletion": true,
            }],
        }
    });
    let pp = PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PatchParams::default()
    };
    match ctx
        .api::<Pod>()
        .patch(pod_name, &pp, &Patch::Merge(&patch))
        .await
    {
        Ok(_) => {
            debug!(run = %name, pod = %pod_name, "claimed the warm pod");
            Ok(())
        }
        Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => {
            debug!(run = %name, pod = %pod_name, code = s.code, "the warm pod was taken or is gone");
            Ok(())
        }
        Err(e) => Err(kube_err(format!("claiming warm pod {pod_name}"))(e)),
    }
}

async fn finish(
    run: &ToolRun,
    status: ToolRunStatus,
    delete: Option<String>,
    ctx: &Context,
) -> Result<Action, Error> {
    let verdict = status.verdict.unwrap_or(Verdict::InfraError);
    let reason = status.reason.clone().unwrap_or_default();
    let written = write_status(run, status, ctx).await?;
    ctx.metrics
        .runs
        .get_or_create(&VerdictLabels {
            verdict: verdict.as_str().into(),
        })
        .inc();
    observe_since_creation(run, &ctx.metrics.completion_seconds);
    info!(run = %run.name_any(), verdict = verdict.as_str(), %reason, "result recorded");
    let (type_, event_reason, note) = match verdict {
        Verdict::Cancelled => (EventType::Normal, "Cancelled", reason),
        Verdict::InfraError => (EventType::Warning, "InfraError", reason),
        v => (
            EventType::Normal,
            "Finished",
            match written.exit_code {
                Some(code) => format!("verdict {}, exit code {code}", v.as_str()),
                None => format!("verdict {}", v.as_str()),
            },
        ),
    };
    ctx.event(run, type_, event_reason, note).await;
    if let Some(pod_name) = delete {
        ctx.delete_pod(&pod_name).await?;
    }
    // The TTL check comes with the next look.
    Ok(Action::requeue(Duration::ZERO))
}

/// Applies the complete status (see [`decide::compose_status`]); fails with a conflict
/// when the ToolRun changed since it was read.
async fn write_status(
    run: &ToolRun,
    status: ToolRunStatus,
    ctx: &Context,
) -> Result<ToolRunStatus, Error> {
    let status = decide::compose_status(run, status, Timestamp::now());
    let written = apply_status(&ctx.api::<ToolRun>(), run, &status).await?;
    ctx.fresh_runs.remember(&run.name_any(), &written);
    Ok(status)
}

async fn read_log(ctx: &Context, pod_name: &str) -> Result<Result<String, RecordError>, Error> {
    let lp = LogParams {
        container: Some(RUN_CONTAINER.into()),
        ..LogParams::default()
    };
    match ctx.api::<Pod>().logs(pod_name, &lp).await {
        Ok(log) => Ok(Ok(log)),
        // The kubelet no longer has it (pod gone, container never ran): no record.
        Err(kube::Error::Api(s)) if (400..500).contains(&s.code) && s.code != 429 => {
            Ok(Err(RecordError::LogUnavailable(s.message)))
        }
        Err(e) => Err(kube_err(format!("reading the log of pod {pod_name}"))(e)),
    }
}

fn observe_since_creation(
    run: &ToolRun,
    histogram: &prometheus_client::metrics::histogram::Histogram,
) {
    if let Some(created) = &run.metadata.creation_timestamp {
        let ms = Timestamp::now().as_millisecond() - created.0.as_millisecond();
        histogram.observe(ms.max(0) as f64 / 1000.0);
    }
}

/// The size of `run`'s spec in JSON (what is left of an object's size goes to artifacts).
fn spec_json_bytes(run: &ToolRun) -> usize {
    serde_json::to_vec(&run.spec).map_or(0, |v| v.len())
}
