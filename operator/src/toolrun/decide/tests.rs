use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStateWaiting,
    ContainerStatus, PodCondition, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use toolrun_crd::ToolRunSpec;

use super::*;

const NS: &str = "toolrun-sandbox";
const UID: &str = "uid-1";
const GRACE: Duration = Duration::from_secs(30);

fn ts(secs: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + secs).unwrap()
}

fn run() -> ToolRun {
    let mut run = ToolRun::new(
        "tr-1",
        ToolRunSpec {
            tool: "run_code".into(),
            call_id: "call-1".into(),
            language: "python".into(),
            code: "print(1)".into(),
            image: None,
            command: Vec::new(),
            args: vec![],
            env: vec![],
            stdin: String::new(),
            limits: Default::default(),
            ttl_seconds_after_finished: Some(60),
            runtime_class_name: None,
            session: None,
            cancel: false,
        },
    );
    run.metadata.namespace = Some(NS.into());
    run.metadata.uid = Some(UID.into());
    run.metadata.generation = Some(1);
    run.metadata.resource_version = Some("10".into());
    run.metadata.creation_timestamp = Some(Time(ts(0)));
    run
}

fn with_status(mut run: ToolRun, status: ToolRunStatus) -> ToolRun {
    run.status = Some(status);
    run
}

fn status(phase: Phase, pod: &str) -> ToolRunStatus {
    ToolRunStatus {
        phase: Some(phase),
        pod_name: Some(pod.into()),
        ..ToolRunStatus::default()
    }
}

fn owner(uid: &str) -> OwnerReference {
    OwnerReference {
        api_version: "toolrun.dev/v1alpha1".into(),
        kind: "ToolRun".into(),
        name: "tr-1".into(),
        uid: uid.into(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

fn pod(name: &str, phase: &str, run_state: Option<ContainerState>) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(NS.into()),
            owner_references: Some(vec![owner(UID)]),
            creation_timestamp: Some(Time(ts(1))),
            ..ObjectMeta::default()
        },
        spec: None,
        status: Some(PodStatus {
            phase: Some(phase.into()),
            container_statuses: run_state.map(|s| {
                vec![ContainerStatus {
                    name: RUN_CONTAINER.into(),
                    image: "toolrun/sandbox:0.1.0".into(),
                    state: Some(s),
                    ..ContainerStatus::default()
                }]
            }),
            ..PodStatus::default()
        }),
    }
}

fn running() -> ContainerState {
    ContainerState {
        running: Some(ContainerStateRunning {
            started_at: Some(Time(ts(2))),
        }),
        ..ContainerState::default()
    }
}

fn exited(code: i32) -> ContainerState {
    ContainerState {
        terminated: Some(ContainerStateTerminated {
            exit_code: code,
            ..ContainerStateTerminated::default()
        }),
        ..ContainerState::default()
    }
}

fn waiting(reason: &str) -> ContainerState {
    ContainerState {
        waiting: Some(ContainerStateWaiting {
            reason: Some(reason.into()),
            message: Some("details".into()),
        }),
        ..ContainerState::default()
    }
}

fn decide_at(run: &ToolRun, pod: Option<&Pod>, secs: i64) -> Decision {
    decide(
        run,
        pod,
        None,
        Warm::default(),
        ts(secs),
        &OperatorConfig::default(),
        GRACE,
    )
}

fn finished_reason(d: &Decision) -> (Verdict, String, Option<String>) {
    match d {
        Decision::Finish { status, delete_pod } => (
            status.verdict.unwrap(),
            status.reason.clone().unwrap_or_default(),
            delete_pod.clone(),
        ),
        other => panic!("expected Finish, got {other:?}"),
    }
}

#[test]
fn a_new_run_gets_its_pod_named_after_it() {
    let d = decide_at(&run(), None, 1);
    let Decision::CreatePod { config_map, pod } = d else {
        panic!("{d:?}")
    };
    assert_eq!(pod.metadata.name.as_deref(), Some("tr-1"));
    assert_eq!(config_map.metadata.name.as_deref(), Some("tr-1"));
    let owners = pod.metadata.owner_references.as_ref().unwrap();
    assert_eq!(owners[0].uid, UID);
    assert_eq!(owners[0].controller, Some(true));
    assert_eq!(owners[0].block_owner_deletion, Some(true));
    // Still no pod but the status already names one we did not see yet (the operator
    // died between create and status): create again (AlreadyExists is success).
    let d = decide_at(&with_status(run(), ToolRunStatus::default()), None, 1);
    assert!(matches!(d, Decision::CreatePod { .. }), "{d:?}");
}

#[test]
fn a_run_the_builders_refuse_is_an_infra_error_not_a_crash() {
    let mut r = run();
    r.spec.limits.memory_mib = Some(1_000_000);
    let (v, reason, delete) = finished_reason(&decide_at(&r, None, 1));
    assert_eq!(v, Verdict::InfraError);
    assert!(
        reason.starts_with("invalid ToolRun: limits.memoryMiB"),
        "{reason}"
    );
    assert_eq!(delete, None);
    let mut r = run();
    r.spec.runtime_class_name = Some("runc".into());
    let (v, reason, _) = finished_reason(&decide_at(&r, None, 1));
    assert_eq!(v, Verdict::InfraError);
    assert!(reason.contains("runtimeClassName"), "{reason}");
}

#[test]
fn pending_then_running_then_the_log() {
    let p = pod("tr-1", "Pending", Some(waiting("ContainerCreating")));
    let d = decide_at(&run(), Some(&p), 2);
    assert_eq!(
        d,
        Decision::Progress {
            phase: Phase::Pending,
            pod_name: "tr-1".into(),
            start_time: None
        }
    );
    let pending = with_status(run(), status(Phase::Pending, "tr-1"));
    assert_eq!(decide_at(&pending, Some(&p), 2), Decision::Wait(None));

    let p = pod("tr-1", "Running", Some(running()));
    assert_eq!(
        decide_at(&pending, Some(&p), 3),
        Decision::Progress {
            phase: Phase::Running,
            pod_name: "tr-1".into(),
            start_time: Some(Time(ts(2)))
        }
    );
    let running_run = with_status(run(), status(Phase::Running, "tr-1"));
    assert_eq!(decide_at(&running_run, Some(&p), 3), Decision::Wait(None));

    for phase in ["Succeeded", "Failed"] {
        let p = pod("tr-1", phase, Some(exited(0)));
        assert_eq!(
            decide_at(&running_run, Some(&p), 4),
            Decision::ReadLog {
                pod_name: "tr-1".into(),
                started: true
            }
        );
    }
    // Failed before the run container ran (e.g. the init container failed): no log.
    let p = pod("tr-1", "Failed", Some(waiting("PodInitializing")));
    assert_eq!(
        decide_at(&pending, Some(&p), 4),
        Decision::ReadLog {
            pod_name: "tr-1".into(),
            started: false
        }
    );
}

#[test]
fn stuck_pending_pods_fail_after_the_grace() {
    for (reason, expected) in [
        ("ErrImagePull", "image not found: toolrun/sandbox:0.1.0"),
        ("ImagePullBackOff", "image not found: toolrun/sandbox:0.1.0"),
        ("InvalidImageName", "image not found: toolrun/sandbox:0.1.0"),
        (
            "CreateContainerConfigError",
            "container run cannot be created",
        ),
    ] {
        let p = pod("tr-1", "Pending", Some(waiting(reason)));
        let r = with_status(run(), status(Phase::Pending, "tr-1"));
        // Pod created at 1 s: within the grace, look again when it ends.
        assert_eq!(
            decide_at(&r, Some(&p), 11),
            Decision::Wait(Some(Duration::from_secs(20)))
        );
        let (v, why, delete) = finished_reason(&decide_at(&r, Some(&p), 31));
        assert_eq!(v, Verdict::InfraError);
        assert!(why.starts_with(expected), "{why}");
        assert_eq!(delete.as_deref(), Some("tr-1"), "the stuck pod is deleted");
    }
    // The init container's image counts too.
    let mut p = pod("tr-1", "Pending", None);
    p.status.as_mut().unwrap().init_container_statuses = Some(vec![ContainerStatus {
        name: "install-runner".into(),
        image: "toolrun/runner:nope".into(),
        state: Some(waiting("ErrImagePull")),
        ..ContainerStatus::default()
    }]);
    let (_, why, _) = finished_reason(&decide_at(&run(), Some(&p), 40));
    assert!(
        why.starts_with("image not found: toolrun/runner:nope"),
        "{why}"
    );
    // No node fits.
    let mut p = pod("tr-1", "Pending", None);
    p.status.as_mut().unwrap().conditions = Some(vec![PodCondition {
        type_: "PodScheduled".into(),
        status: "False".into(),
        reason: Some("Unschedulable".into()),
        message: Some("0/1 nodes are available".into()),
        ..PodCondition::default()
    }]);
    assert!(matches!(
        decide_at(&run(), Some(&p), 5),
        Decision::Wait(Some(_))
    ));
    let (v, why, _) = finished_reason(&decide_at(&run(), Some(&p), 40));
    assert_eq!(v, Verdict::InfraError);
    assert_eq!(why, "unschedulable: 0/1 nodes are available");
}

#[test]
fn cancel_stops_a_run_that_has_not_finished() {
    let mut r = with_status(run(), status(Phase::Running, "tr-1"));
    r.spec.cancel = true;
    let p = pod("tr-1", "Running", Some(running()));
    let (v, _, delete) = finished_reason(&decide_at(&r, Some(&p), 3));
    assert_eq!(v, Verdict::Cancelled);
    assert_eq!(delete.as_deref(), Some("tr-1"));
    // No pod yet: cancelled without one.
    let mut fresh = run();
    fresh.spec.cancel = true;
    let (v, _, delete) = finished_reason(&decide_at(&fresh, None, 1));
    assert_eq!(v, Verdict::Cancelled);
    assert_eq!(delete, None);
    // The program already finished: its result wins.
    let done = pod("tr-1", "Succeeded", Some(exited(0)));
    assert!(matches!(
        decide_at(&r, Some(&done), 3),
        Decision::ReadLog { .. }
    ));
}

#[test]
fn finished_runs_are_never_rewritten_and_go_after_their_ttl() {
    let mut st = status(Phase::Succeeded, "tr-1");
    st.verdict = Some(Verdict::Ok);
    st.completion_time = Some(Time(ts(10)));
    let mut r = with_status(run(), st);
    r.spec.cancel = true; // a late cancel changes nothing
    let p = pod("tr-1", "Succeeded", Some(exited(0)));
    assert_eq!(
        decide_at(&r, Some(&p), 20),
        Decision::Wait(Some(Duration::from_secs(50)))
    );
    assert_eq!(
        decide_at(&r, None, 20),
        Decision::Wait(Some(Duration::from_secs(50)))
    );
    assert_eq!(decide_at(&r, Some(&p), 70), Decision::DeleteRun);
    // A finished run whose pod still runs: recorded without the runner (cancelled;
    // failed while pending), the pod is stopped; after the runner's own record (read
    // from the live log) the runner is exiting and its pod is kept for its log.
    let live = pod("tr-1", "Running", Some(running()));
    assert_eq!(
        decide_at(&r, Some(&live), 20),
        Decision::Wait(Some(Duration::from_secs(50)))
    );
    for verdict in [Verdict::Cancelled, Verdict::InfraError] {
        let mut st = status(Phase::Failed, "tr-1");
        st.verdict = Some(verdict);
        st.completion_time = Some(Time(ts(10)));
        assert_eq!(
            decide_at(&with_status(run(), st), Some(&live), 20),
            Decision::DeletePod {
                name: "tr-1".into()
            },
            "{verdict:?}"
        );
    }
    // The default TTL applies when the spec has none.
    r.spec.ttl_seconds_after_finished = None;
    assert_eq!(
        decide_at(&r, Some(&p), 20),
        Decision::Wait(Some(Duration::from_secs(3_600 - 10)))
    );
    // TTL 0: at once.
    r.spec.ttl_seconds_after_finished = Some(0);
    assert_eq!(decide_at(&r, Some(&p), 10), Decision::DeleteRun);
}

#[test]
fn a_pod_lost_before_the_program_started_is_retried_once() {
    // Seen (status names it), pending, now gone.
    let r = with_status(run(), status(Phase::Pending, "tr-1"));
    assert_eq!(
        decide_at(&r, None, 5),
        Decision::Retry {
            reason: "pod tr-1 disappeared before the program started".into(),
            next_pod: "tr-1-retry".into()
        }
    );
    // Deleted while pending.
    let mut p = pod("tr-1", "Pending", None);
    p.metadata.deletion_timestamp = Some(Time(ts(4)));
    assert!(matches!(decide_at(&r, Some(&p), 5), Decision::Retry { .. }));
    // Evicted before it started.
    let mut p = pod("tr-1", "Failed", None);
    p.status.as_mut().unwrap().reason = Some("Evicted".into());
    assert!(matches!(decide_at(&r, Some(&p), 5), Decision::Retry { .. }));

    // After the retry the condition makes the second pod current...
    let mut retried = status(Phase::Pending, "tr-1");
    retried.pod_name = None;
    retried.conditions = vec![retried_condition(&run(), "lost", ts(5))];
    let r = with_status(run(), retried);
    assert_eq!(attempt(r.status.as_ref()), 1);
    assert_eq!(current_pod_name(&r), "tr-1-retry");
    let Decision::CreatePod { pod, .. } = decide_at(&r, None, 6) else {
        panic!()
    };
    assert_eq!(pod.metadata.name.as_deref(), Some("tr-1-retry"));
    // ...and losing it too is final.
    let mut again = r.status.clone().unwrap();
    again.pod_name = Some("tr-1-retry".into());
    let r = with_status(run(), again);
    let (v, why, _) = finished_reason(&decide_at(&r, None, 9));
    assert_eq!(v, Verdict::InfraError);
    assert!(why.contains("after one retry"), "{why}");
}

#[test]
fn a_pod_lost_after_the_program_started_is_an_infra_error() {
    let r = with_status(run(), status(Phase::Running, "tr-1"));
    let (v, why, _) = finished_reason(&decide_at(&r, None, 5));
    assert_eq!(v, Verdict::InfraError);
    assert_eq!(
        why,
        "pod tr-1 disappeared while the program ran (not retried: the program had started)"
    );
    let mut p = pod("tr-1", "Running", Some(running()));
    p.metadata.deletion_timestamp = Some(Time(ts(4)));
    let (v, why, _) = finished_reason(&decide_at(&r, Some(&p), 5));
    assert_eq!(v, Verdict::InfraError);
    assert!(
        why.starts_with("pod tr-1 was deleted while the program ran"),
        "{why}"
    );
}

#[test]
fn pods_of_others_are_never_adopted() {
    // Left by an earlier ToolRun of the same name: wait for the garbage collector.
    let mut p = pod("tr-1", "Running", Some(running()));
    p.metadata.owner_references = Some(vec![owner("old-uid")]);
    assert_eq!(
        decide_at(&run(), Some(&p), 1),
        Decision::Wait(Some(FOREIGN_POD_RECHECK))
    );
    // Someone else's pod: refuse.
    p.metadata.owner_references = None;
    let (v, why, delete) = finished_reason(&decide_at(&run(), Some(&p), 1));
    assert_eq!(v, Verdict::InfraError);
    assert!(why.contains("does not belong to this ToolRun"), "{why}");
    assert_eq!(delete, None, "not ours to delete");
}

#[test]
fn composed_status_has_times_generation_and_conditions() {
    let mut r = with_status(run(), status(Phase::Running, "tr-1"));
    r.status.as_mut().unwrap().start_time = Some(Time(ts(2)));
    r.metadata.generation = Some(3);
    let result = ToolRunStatus {
        phase: Some(Phase::Failed),
        verdict: Some(Verdict::RuntimeError),
        exit_code: Some(1),
        ..ToolRunStatus::default()
    };
    let s = compose_status(&r, result, ts(5));
    assert_eq!(s.start_time, Some(Time(ts(2))), "kept");
    assert_eq!(s.completion_time, Some(Time(ts(5))));
    assert_eq!(s.pod_name.as_deref(), Some("tr-1"), "kept");
    assert_eq!(s.observed_generation, Some(3));
    assert_eq!(s.conditions.len(), 1);
    let ready = &s.conditions[0];
    assert_eq!(
        (
            ready.type_.as_str(),
            ready.status.as_str(),
            ready.reason.as_str()
        ),
        ("Ready", "True", "RuntimeError")
    );
    assert_eq!(ready.observed_generation, Some(3));
    assert_eq!(ready.last_transition_time, Time(ts(5)));

    // Progress keeps the Ready=False transition time and carries Retried along.
    let mut old = status(Phase::Pending, "tr-1-retry");
    old.conditions = vec![
        Condition {
            type_: READY.into(),
            status: "False".into(),
            reason: "Pending".into(),
            message: String::new(),
            observed_generation: Some(1),
            last_transition_time: Time(ts(1)),
        },
        retried_condition(&run(), "lost", ts(1)),
    ];
    let r = with_status(run(), old);
    let s = compose_status(&r, status(Phase::Running, "tr-1-retry"), ts(9));
    assert_eq!(s.conditions.len(), 2);
    assert_eq!(s.conditions[0].last_transition_time, Time(ts(1)));
    assert_eq!(s.conditions[0].reason, "Running");
    assert_eq!(s.conditions[1].type_, RETRIED);
    assert_eq!(s.completion_time, None);
    assert_eq!(camel("MEMORY_LIMIT"), "MemoryLimit");
    assert_eq!(camel("OK"), "Ok");
}

fn runner_record(exit_code: i32) -> RunRecord {
    RunRecord {
        version: toolrun_runner::PROTOCOL_VERSION,
        verdict: if exit_code == 0 {
            toolrun_runner::Verdict::Ok
        } else {
            toolrun_runner::Verdict::RuntimeError
        },
        exit_code,
        signal: None,
        stdout: "1\n".into(),
        stderr: String::new(),
        stdout_truncated: false,
        stderr_truncated: false,
        timed_out: false,
        duration_ms: 5,
        message: String::new(),
        artifacts: None,
    }
}

fn decide_live(run: &ToolRun, pod: Option<&Pod>, record: &RunRecord, secs: i64) -> Decision {
    decide(
        run,
        pod,
        Some(record),
        Warm::default(),
        ts(secs),
        &OperatorConfig::default(),
        GRACE,
    )
}

#[test]
fn a_record_read_from_the_live_log_is_recorded_before_the_pod_finishes() {
    let rec = runner_record(0);
    let recorded = Decision::Record {
        pod_name: "tr-1".into(),
        record: Box::new(rec.clone()),
    };
    let running_run = with_status(run(), status(Phase::Running, "tr-1"));
    let p = pod("tr-1", "Running", Some(running()));
    // Without it the run waits for the pod; with it, it is recorded now.
    assert_eq!(decide_at(&running_run, Some(&p), 3), Decision::Wait(None));
    assert_eq!(decide_live(&running_run, Some(&p), &rec, 3), recorded);
    // Never seen running (the record can come before the Running status is written).
    let pending = with_status(run(), status(Phase::Pending, "tr-1"));
    assert_eq!(decide_live(&pending, Some(&p), &rec, 3), recorded);
    // The kubelet already reports the exit: the same record, no second log read.
    let done = pod("tr-1", "Succeeded", Some(exited(0)));
    assert_eq!(decide_live(&running_run, Some(&done), &rec, 4), recorded);
    // The pod is being deleted after the runner wrote its record: the result stands.
    let mut going = p.clone();
    going.metadata.deletion_timestamp = Some(Time(ts(3)));
    assert_eq!(decide_live(&running_run, Some(&going), &rec, 4), recorded);
    // A failing program's record is recorded the same way.
    let failed = runner_record(3);
    assert!(matches!(
        decide_live(&running_run, Some(&p), &failed, 3),
        Decision::Record { record, .. } if record.exit_code == 3
    ));
}

#[test]
fn a_live_record_never_overrides_a_recorded_result_or_a_foreign_pod() {
    let rec = runner_record(0);
    // Cancelled first: the cancel stands (and the pod, still running, is stopped).
    let mut st = status(Phase::Failed, "tr-1");
    st.verdict = Some(Verdict::Cancelled);
    st.completion_time = Some(Time(ts(10)));
    let cancelled = with_status(run(), st);
    let p = pod("tr-1", "Running", Some(running()));
    assert_eq!(
        decide_live(&cancelled, Some(&p), &rec, 11),
        Decision::DeletePod {
            name: "tr-1".into()
        }
    );
    // Already recorded (by another look): nothing is written again.
    let mut st = status(Phase::Succeeded, "tr-1");
    st.verdict = Some(Verdict::Ok);
    st.completion_time = Some(Time(ts(10)));
    let done = with_status(run(), st);
    assert_eq!(
        decide_live(&done, Some(&p), &rec, 11),
        Decision::Wait(Some(Duration::from_secs(59)))
    );
    // A cancel asked for but not yet recorded comes too late, as for a finished pod.
    let mut r = with_status(run(), status(Phase::Running, "tr-1"));
    r.spec.cancel = true;
    assert!(matches!(
        decide_live(&r, Some(&p), &rec, 3),
        Decision::Record { .. }
    ));
    // No pod, or a pod that is not this run's: the record is not used.
    let running_run = with_status(run(), status(Phase::Running, "tr-1"));
    assert!(matches!(
        decide_live(&running_run, None, &rec, 3),
        Decision::Finish { .. }
    ));
    let mut foreign = p.clone();
    foreign.metadata.owner_references = Some(vec![owner("other-uid")]);
    assert_eq!(
        decide_live(&running_run, Some(&foreign), &rec, 3),
        Decision::Wait(Some(FOREIGN_POD_RECHECK))
    );
}

#[test]
fn logs_are_followed_only_while_the_current_program_runs_unrecorded() {
    let rec = runner_record(0);
    let running_run = with_status(run(), status(Phase::Running, "tr-1"));
    let p = pod("tr-1", "Running", Some(running()));
    assert!(follow_log(&running_run, &p, None));
    assert!(
        follow_log(&run(), &p, None),
        "before the Running status is written"
    );
    assert!(!follow_log(&running_run, &p, Some(&rec)), "already read");
    // Not started, or already finished as the kubelet says.
    let waiting_pod = pod("tr-1", "Pending", Some(waiting("PodInitializing")));
    assert!(!follow_log(&running_run, &waiting_pod, None));
    let done = pod("tr-1", "Succeeded", Some(exited(0)));
    assert!(!follow_log(&running_run, &done, None));
    // Being deleted, cancelled, finished.
    let mut going = p.clone();
    going.metadata.deletion_timestamp = Some(Time(ts(3)));
    assert!(!follow_log(&running_run, &going, None));
    let mut cancelled = running_run.clone();
    cancelled.spec.cancel = true;
    assert!(!follow_log(&cancelled, &p, None));
    let mut st = status(Phase::Succeeded, "tr-1");
    st.verdict = Some(Verdict::Ok);
    assert!(!follow_log(&with_status(run(), st), &p, None));
    // Not this run's pod, or not the current attempt's.
    let mut foreign = p.clone();
    foreign.metadata.owner_references = Some(vec![owner("other-uid")]);
    assert!(!follow_log(&running_run, &foreign, None));
    let retry = pod("tr-1-retry", "Running", Some(running()));
    assert!(!follow_log(&running_run, &retry, None));
}

// ---- Warm pods: the binding is recorded before it is used ----

fn warm_config() -> OperatorConfig {
    let mut c = OperatorConfig::default();
    c.warm_pool.insert("python".into(), 2);
    c
}

/// A warm pod of the python pool: unclaimed (no owner) unless `owned`, agent running.
fn warm_pod(name: &str, owned: bool) -> Pod {
    let mut p = pod(name, "Running", None);
    p.metadata.owner_references = owned.then(|| vec![owner(UID)]);
    p.metadata.resource_version = Some("77".into());
    p.metadata.labels = Some(
        [(
            toolrun_crd::labels::WARM_POOL.to_string(),
            "python".to_string(),
        )]
        .into(),
    );
    p.status.as_mut().unwrap().container_statuses = Some(vec![ContainerStatus {
        name: builders::AGENT_CONTAINER.into(),
        state: Some(running()),
        ..ContainerStatus::default()
    }]);
    p
}

fn bound(phase: Phase, pod: &str) -> ToolRunStatus {
    let mut s = status(phase, pod);
    s.conditions = vec![bound_condition(&run(), true, "bound", ts(1))];
    s
}

fn decide_warm(
    run: &ToolRun,
    pod: Option<&Pod>,
    warm: Warm<'_>,
    record: Option<&RunRecord>,
) -> Decision {
    decide(run, pod, record, warm, ts(5), &warm_config(), GRACE)
}

#[test]
fn only_runs_with_the_default_pod_may_use_a_warm_pod() {
    let config = warm_config();
    assert_eq!(warm_language(&run(), &config), Some("python"));
    // Control: the same run without a pool for its language.
    assert_eq!(warm_language(&run(), &OperatorConfig::default()), None);
    let mut js = run();
    js.spec.language = "javascript".into();
    assert_eq!(warm_language(&js, &config), None);
    // Other pod resources or RuntimeClass: a pod of its own.
    let mut big = run();
    big.spec.limits.memory_mib = Some(config.default_limits.memory_mib * 2);
    assert_eq!(warm_language(&big, &config), None);
    let mut cpu = run();
    cpu.spec.limits.cpu_millis = Some(config.default_limits.cpu_millis + 1);
    assert_eq!(warm_language(&cpu, &config), None);
    let mut rc = run();
    rc.spec.runtime_class_name = Some("gvisor".into());
    assert_eq!(warm_language(&rc, &config), None);
    // A session's run: its session's pod, never a one-shot warm pod.
    let mut in_session = run();
    in_session.spec.session = Some("ts-a".into());
    assert_eq!(warm_language(&in_session, &config), None);
    // The timeout and output bounds travel in the request: still warm.
    let mut t = run();
    t.spec.limits.timeout_seconds = Some(5);
    t.spec.limits.output_bytes = Some(1024);
    assert_eq!(warm_language(&t, &config), Some("python"));
}

#[test]
fn a_new_run_binds_a_ready_warm_pod_before_claiming_it() {
    let w = warm_pod("warm-python-a", false);
    let d = decide_warm(
        &run(),
        None,
        Warm {
            candidate: Some(&w),
            failure: None,
            session: None,
        },
        None,
    );
    assert_eq!(
        d,
        Decision::Bind {
            pod_name: "warm-python-a".into()
        }
    );
    // Without a candidate: the cold path.
    let d = decide_warm(&run(), None, Warm::default(), None);
    assert!(matches!(d, Decision::CreatePod { .. }), "{d:?}");
    // A candidate that is not ready, of another language, or claimed is not bound.
    let mut starting = warm_pod("warm-python-b", false);
    starting.status.as_mut().unwrap().phase = Some("Pending".into());
    let mut other = warm_pod("warm-js", false);
    other.metadata.labels = Some(
        [(
            toolrun_crd::labels::WARM_POOL.to_string(),
            "javascript".to_string(),
        )]
        .into(),
    );
    let claimed = warm_pod("warm-python-c", true);
    for c in [&starting, &other, &claimed] {
        let d = decide_warm(
            &run(),
            None,
            Warm {
                candidate: Some(c),
                failure: None,
                session: None,
            },
            None,
        );
        assert!(matches!(d, Decision::CreatePod { .. }), "{d:?}");
    }
    // After an unbinding or a retry, never again.
    let mut unbound = ToolRunStatus {
        phase: Some(Phase::Pending),
        ..ToolRunStatus::default()
    };
    unbound.conditions = vec![bound_condition(&run(), false, "taken", ts(1))];
    let r = with_status(run(), unbound);
    let d = decide_warm(
        &r,
        None,
        Warm {
            candidate: Some(&w),
            failure: None,
            session: None,
        },
        None,
    );
    assert!(matches!(d, Decision::CreatePod { .. }), "{d:?}");
}

#[test]
fn a_bound_run_claims_its_pod_with_the_version_it_saw_or_unbinds() {
    let r = with_status(run(), bound(Phase::Pending, "warm-python-a"));
    assert_eq!(current_pod_name(&r), "warm-python-a");
    let free = warm_pod("warm-python-a", false);
    assert_eq!(
        decide_warm(&r, Some(&free), Warm::default(), None),
        Decision::Claim {
            pod_name: "warm-python-a".into(),
            resource_version: "77".into()
        }
    );
    // Taken by another run (owned by another uid): unbind, nothing to delete.
    let mut taken = warm_pod("warm-python-a", false);
    taken.metadata.owner_references = Some(vec![owner("other-uid")]);
    match decide_warm(&r, Some(&taken), Warm::default(), None) {
        Decision::Unbind { delete_pod, reason } => {
            assert_eq!(delete_pod, None);
            assert!(reason.contains("taken"), "{reason}");
        }
        d => panic!("{d:?}"),
    }
    // Gone before anything was sent: unbind (the cold path runs it once).
    assert!(matches!(
        decide_warm(&r, None, Warm::default(), None),
        Decision::Unbind {
            delete_pod: None,
            ..
        }
    ));
    // Claimed, then it failed before the request: unbind and delete it.
    let mut failed = warm_pod("warm-python-a", true);
    failed.status.as_mut().unwrap().phase = Some("Failed".into());
    assert_eq!(
        decide_warm(&r, Some(&failed), Warm::default(), None),
        Decision::Unbind {
            reason: "warm pod warm-python-a stopped before the run was sent".into(),
            delete_pod: Some("warm-python-a".into())
        }
    );
}

#[test]
fn a_claimed_pod_goes_running_before_the_request_and_then_runs_on_the_agent() {
    let owned = warm_pod("warm-python-a", true);
    let r = with_status(run(), bound(Phase::Pending, "warm-python-a"));
    assert_eq!(
        decide_warm(&r, Some(&owned), Warm::default(), None),
        Decision::Progress {
            phase: Phase::Running,
            pod_name: "warm-python-a".into(),
            start_time: Some(Time(ts(5)))
        }
    );
    let r = with_status(run(), bound(Phase::Running, "warm-python-a"));
    assert_eq!(
        decide_warm(&r, Some(&owned), Warm::default(), None),
        Decision::RunOnAgent {
            pod_name: "warm-python-a".into()
        }
    );
    // The agent's record is recorded like a live log's.
    let rec = runner_record(0);
    assert!(matches!(
        decide_warm(&r, Some(&owned), Warm::default(), Some(&rec)),
        Decision::Record { ref pod_name, .. } if pod_name == "warm-python-a"
    ));
    // The relay gave up: INFRA_ERROR naming it, the pod deleted.
    let d = decide_warm(
        &r,
        Some(&owned),
        Warm {
            candidate: None,
            failure: Some("unreachable after 6 attempts"),
            session: None,
        },
        None,
    );
    let (v, reason, delete) = finished_reason(&d);
    assert_eq!(v, Verdict::InfraError);
    assert!(reason.contains("unreachable after 6 attempts"), "{reason}");
    assert_eq!(delete.as_deref(), Some("warm-python-a"));
}

#[test]
fn a_warm_run_is_never_sent_twice_nor_unbound_once_sent() {
    let r = with_status(run(), bound(Phase::Running, "warm-python-a"));
    // Lost after Running: INFRA_ERROR, not the cold path (the program may have run).
    let (v, reason, _) = finished_reason(&decide_warm(&r, None, Warm::default(), None));
    assert_eq!(v, Verdict::InfraError);
    assert!(reason.contains("while the program ran"), "{reason}");
    let mut going = warm_pod("warm-python-a", true);
    going.metadata.deletion_timestamp = Some(Time(ts(4)));
    let (v, _, delete) = finished_reason(&decide_warm(&r, Some(&going), Warm::default(), None));
    assert_eq!(v, Verdict::InfraError);
    assert_eq!(delete, None);
    // Even when the pod looks free again (someone removed the owner reference).
    let free = warm_pod("warm-python-a", false);
    let (v, _, _) = finished_reason(&decide_warm(&r, Some(&free), Warm::default(), None));
    assert_eq!(v, Verdict::InfraError);
}

#[test]
fn a_cancelled_warm_run_stops_and_its_pod_goes() {
    let mut r = with_status(run(), bound(Phase::Running, "warm-python-a"));
    r.spec.cancel = true;
    let owned = warm_pod("warm-python-a", true);
    let (v, _, delete) = finished_reason(&decide_warm(&r, Some(&owned), Warm::default(), None));
    assert_eq!(v, Verdict::Cancelled);
    assert_eq!(delete.as_deref(), Some("warm-python-a"));
    // Bound but not yet claimed: cancelled without touching the pool's pod.
    let mut r = with_status(run(), bound(Phase::Pending, "warm-python-a"));
    r.spec.cancel = true;
    let free = warm_pod("warm-python-a", false);
    let (v, _, delete) = finished_reason(&decide_warm(&r, Some(&free), Warm::default(), None));
    assert_eq!(v, Verdict::Cancelled);
    assert_eq!(delete, None);
}

#[test]
fn a_finished_warm_run_deletes_its_pod_at_once() {
    let mut s = bound(Phase::Succeeded, "warm-python-a");
    s.verdict = Some(Verdict::Ok);
    s.completion_time = Some(Time(ts(4)));
    let r = with_status(run(), s);
    let owned = warm_pod("warm-python-a", true);
    assert_eq!(
        decide_warm(&r, Some(&owned), Warm::default(), None),
        Decision::DeletePod {
            name: "warm-python-a".into()
        }
    );
    // A cold pod of a finished run is kept (its log stays readable): control.
    let mut s = status(Phase::Succeeded, "tr-1");
    s.verdict = Some(Verdict::Ok);
    s.completion_time = Some(Time(ts(4)));
    let cold = pod("tr-1", "Running", Some(running()));
    assert!(matches!(
        decide_warm(&with_status(run(), s), Some(&cold), Warm::default(), None),
        Decision::Wait(_)
    ));
}

#[test]
fn bound_and_retried_conditions_survive_later_writes() {
    let r = with_status(run(), bound(Phase::Running, "warm-python-a"));
    let next = compose_status(
        &r,
        ToolRunStatus {
            phase: Some(Phase::Succeeded),
            verdict: Some(Verdict::Ok),
            ..ToolRunStatus::default()
        },
        ts(9),
    );
    assert!(is_bound(Some(&next)));
    assert_eq!(next.pod_name.as_deref(), Some("warm-python-a"));
}

// ---- Runs in a session go to the session's pod ----

fn session_run() -> ToolRun {
    let mut r = run();
    r.spec.session = Some("ts-abc".into());
    r
}

fn session_pod() -> Pod {
    let mut p = pod("ts-abc", "Running", None);
    p.metadata.labels = Some(
        [(
            toolrun_crd::labels::SESSION.to_string(),
            "ts-abc".to_string(),
        )]
        .into(),
    );
    p.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "toolrun.dev/v1alpha1".into(),
        kind: "ToolSession".into(),
        name: "ts-abc".into(),
        uid: "s-uid".into(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }]);
    p.status.as_mut().unwrap().container_statuses = Some(vec![ContainerStatus {
        name: builders::AGENT_CONTAINER.into(),
        state: Some(running()),
        ..ContainerStatus::default()
    }]);
    p
}

#[test]
fn a_session_run_binds_the_session_pod_and_never_a_pod_of_its_own() {
    let sp = session_pod();
    let r = session_run();
    let w = Warm {
        candidate: Some(&sp),
        failure: None,
        session: Some(Ok(())),
    };
    assert_eq!(
        decide_warm(&r, None, w, None),
        Decision::Bind {
            pod_name: "ts-abc".into()
        }
    );
    // Starting: wait. Missing or failed: INFRA_ERROR naming why. Never CreatePod.
    let starting = Warm {
        candidate: None,
        failure: None,
        session: Some(Ok(())),
    };
    assert!(matches!(
        decide_warm(&r, None, starting, None),
        Decision::Wait(Some(_))
    ));
    let gone = Warm {
        candidate: None,
        failure: None,
        session: Some(Err("no such ToolSession")),
    };
    let (v, reason, _) = finished_reason(&decide_warm(&r, None, gone, None));
    assert_eq!(v, Verdict::InfraError);
    assert!(reason.contains("ts-abc: no such ToolSession"), "{reason}");
    // Another session's pod is not bound.
    let mut other = session_pod();
    other.metadata.labels =
        Some([(toolrun_crd::labels::SESSION.to_string(), "ts-x".to_string())].into());
    let w = Warm {
        candidate: Some(&other),
        failure: None,
        session: Some(Ok(())),
    };
    assert!(matches!(decide_warm(&r, None, w, None), Decision::Wait(_)));
}

#[test]
fn a_session_run_runs_on_the_agent_and_leaves_the_pod_alone() {
    let sp = session_pod();
    let mut s = bound(Phase::Pending, "ts-abc");
    let r = with_status(session_run(), s.clone());
    // No claim: straight to Running, then the agent.
    assert!(matches!(
        decide_warm(&r, Some(&sp), Warm::default(), None),
        Decision::Progress {
            phase: Phase::Running,
            ..
        }
    ));
    s.phase = Some(Phase::Running);
    let r = with_status(session_run(), s.clone());
    assert_eq!(
        decide_warm(&r, Some(&sp), Warm::default(), None),
        Decision::RunOnAgent {
            pod_name: "ts-abc".into()
        }
    );
    // Cancelled or failed: the session's pod is not deleted.
    let mut c = r.clone();
    c.spec.cancel = true;
    let (v, _, delete) = finished_reason(&decide_warm(&c, Some(&sp), Warm::default(), None));
    assert_eq!((v, delete), (Verdict::Cancelled, None));
    let f = Warm {
        candidate: None,
        failure: Some("unreachable"),
        session: None,
    };
    let (v, _, delete) = finished_reason(&decide_warm(&r, Some(&sp), f, None));
    assert_eq!((v, delete), (Verdict::InfraError, None));
    // Finished: the pod stays for the session's next call.
    s.phase = Some(Phase::Succeeded);
    s.verdict = Some(Verdict::Ok);
    s.completion_time = Some(Time(ts(4)));
    let r = with_status(session_run(), s);
    assert!(matches!(
        decide_warm(&r, Some(&sp), Warm::default(), None),
        Decision::Wait(_)
    ));
}
