use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateRunning, ContainerStatus, PodStatus,
};
use k8s_openapi::jiff::SignedDuration;
use toolrun_crd::session::{SessionWorkspace, ToolSessionSpec};

use super::*;
use crate::toolrun::builders::AGENT_CONTAINER;

fn ts(secs: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + secs).unwrap()
}

fn session(idle: u32) -> ToolSession {
    let mut s = ToolSession::new(
        "ts-abc",
        ToolSessionSpec {
            session_id: "abc".into(),
            approval_mode: Default::default(),
            idle_timeout_seconds: Some(idle),
            workspace: SessionWorkspace::default(),
            limits: Default::default(),
            runtime_class_name: None,
        },
    );
    s.metadata.namespace = Some("toolrun-sandbox".into());
    s.metadata.uid = Some("s-uid".into());
    s.metadata.creation_timestamp = Some(Time(ts(0)));
    s.metadata.labels = Some([(labels::TENANT.to_string(), "team-a".to_string())].into());
    s
}

fn pod_of(s: &ToolSession, phase: &str, agent: bool) -> Pod {
    let mut p = session_pod(s, &OperatorConfig::default()).unwrap();
    p.status = Some(PodStatus {
        phase: Some(phase.into()),
        container_statuses: Some(vec![ContainerStatus {
            name: AGENT_CONTAINER.into(),
            state: Some(ContainerState {
                running: agent.then(ContainerStateRunning::default),
                ..ContainerState::default()
            }),
            ..ContainerStatus::default()
        }]),
        ..PodStatus::default()
    });
    p
}

const GRACE: Duration = Duration::from_secs(30);

#[test]
fn a_new_session_gets_its_pod_then_is_ready_when_the_agent_runs() {
    let s = session(600);
    assert_eq!(
        decide(&s, None, None, ts(1), GRACE),
        SessionDecision::CreatePod
    );
    let starting = pod_of(&s, "Pending", false);
    match decide(&s, Some(&starting), None, ts(2), GRACE) {
        SessionDecision::Status(st) => assert_eq!(st.phase, Some(SessionPhase::Pending)),
        d => panic!("{d:?}"),
    }
    let running = pod_of(&s, "Running", true);
    match decide(&s, Some(&running), None, ts(3), GRACE) {
        SessionDecision::Status(st) => {
            assert_eq!(st.phase, Some(SessionPhase::Ready));
            assert_eq!(st.pod_name.as_deref(), Some("ts-abc"));
        }
        d => panic!("{d:?}"),
    }
}

#[test]
fn idle_sessions_expire_from_their_last_activity() {
    let mut s = session(600);
    assert_eq!(
        decide(&s, None, None, ts(600), GRACE),
        SessionDecision::Expire
    );
    // Control: used at 500 s, it lives until 1100 s.
    s.metadata.annotations =
        Some([(labels::LAST_ACTIVITY.to_string(), ts(500).to_string())].into());
    assert_eq!(expires_at(&s), Some(ts(1100)));
    assert_eq!(
        decide(&s, None, None, ts(600), GRACE),
        SessionDecision::CreatePod
    );
    assert_eq!(
        decide(&s, None, None, ts(1100), GRACE),
        SessionDecision::Expire
    );
}

#[test]
fn a_lost_pod_fails_an_emptydir_session_and_is_remade_on_a_claim() {
    let mut s = session(600);
    s.status = Some(ToolSessionStatus {
        phase: Some(SessionPhase::Ready),
        pod_name: Some("ts-abc".into()),
        ..ToolSessionStatus::default()
    });
    match decide(&s, None, None, ts(5), GRACE) {
        SessionDecision::Status(st) => {
            assert_eq!(st.phase, Some(SessionPhase::Failed));
            assert!(st.message.unwrap().contains("disappeared"));
        }
        d => panic!("{d:?}"),
    }
    let failed = pod_of(&s, "Failed", false);
    assert!(matches!(
        decide(&s, Some(&failed), None, ts(5), GRACE),
        SessionDecision::Status(ToolSessionStatus {
            phase: Some(SessionPhase::Failed),
            ..
        })
    ));
    s.spec.workspace.storage_class_name = Some("standard".into());
    assert_eq!(
        decide(&s, None, None, ts(5), GRACE),
        SessionDecision::CreatePod
    );
    let failed = pod_of(&s, "Failed", false);
    assert_eq!(
        decide(&s, Some(&failed), None, ts(5), GRACE),
        SessionDecision::DeletePod("ts-abc".into())
    );
}

#[test]
fn the_session_pod_is_a_locked_down_agent_with_its_workspace() {
    let s = session(600);
    let p = session_pod(&s, &OperatorConfig::default()).unwrap();
    let v = serde_json::to_value(&p).unwrap();
    assert_eq!(v["metadata"]["name"], "ts-abc");
    assert_eq!(v["metadata"]["labels"]["toolrun.dev/session"], "ts-abc");
    assert_eq!(v["metadata"]["labels"]["toolrun.dev/tenant"], "team-a");
    assert_eq!(v["metadata"]["labels"]["toolrun.dev/sandbox"], "true");
    assert_eq!(v["metadata"]["ownerReferences"][0]["kind"], "ToolSession");
    let spec = &v["spec"];
    assert_eq!(spec["automountServiceAccountToken"], false);
    let c = &spec["containers"][0];
    assert_eq!(c["name"], "agent");
    let cmd: Vec<&str> = c["command"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_str().unwrap())
        .collect();
    // The session's size, for the usage the agent reports (statvfs shows the node's disk).
    assert_eq!(
        &cmd[1..],
        [
            "agent",
            "--workspace",
            "/workspace",
            "--workspace-limit-bytes",
            "1073741824"
        ]
    );
    assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true);
    let ws = spec["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "workspace")
        .unwrap();
    assert_eq!(ws["emptyDir"]["sizeLimit"], "1024Mi");
    // The emptyDir counts against the pod's ephemeral storage: it grows by as much.
    assert_eq!(c["resources"]["limits"]["ephemeral-storage"], "1088Mi");
    // A claim of the storage class instead, owned by the session.
    let mut s = session(600);
    s.spec.workspace = SessionWorkspace {
        size_mib: Some(1024),
        storage_class_name: Some("standard".into()),
    };
    let p = serde_json::to_value(session_pod(&s, &OperatorConfig::default()).unwrap()).unwrap();
    let ws = p["spec"]["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "workspace")
        .unwrap()
        .clone();
    assert_eq!(ws["persistentVolumeClaim"]["claimName"], "ts-abc-workspace");
    assert!(
        p["spec"]["containers"][0]["command"]
            .to_string()
            .contains("\"--workspace-limit-bytes\",\"1073741824\""),
        "{p}"
    );
    let claim = serde_json::to_value(workspace_claim(&s, &OperatorConfig::default())).unwrap();
    assert_eq!(claim["spec"]["resources"]["requests"]["storage"], "1024Mi");
    assert_eq!(claim["spec"]["storageClassName"], "standard");
    // A smaller session's own size.
    let mut s = session(600);
    s.spec.workspace.size_mib = Some(512);
    let p = serde_json::to_value(session_pod(&s, &OperatorConfig::default()).unwrap()).unwrap();
    let cmd = p["spec"]["containers"][0]["command"].to_string();
    assert!(
        cmd.contains("\"--workspace-limit-bytes\",\"536870912\""),
        "{cmd}"
    );
    // A RuntimeClass the operator does not allow is refused.
    let mut s = session(600);
    s.spec.runtime_class_name = Some("weak".into());
    assert!(session_pod(&s, &OperatorConfig::default()).is_err());
}

fn warm_config(n: u32) -> OperatorConfig {
    OperatorConfig {
        session_warm_pool: n,
        ..OperatorConfig::default()
    }
}

/// A ready, unclaimed warm session pod as the pool's watch shows it.
fn warm_pod(name: &str, config: &OperatorConfig) -> Pod {
    let hash = warmpool::spec_hash(warmpool::SESSION_POOL, config).unwrap();
    let mut p = warmpool::warm_pod(name, warmpool::SESSION_POOL, &hash, config).unwrap();
    p.metadata.resource_version = Some("41".into());
    p.status = Some(PodStatus {
        phase: Some("Running".into()),
        container_statuses: Some(vec![ContainerStatus {
            name: AGENT_CONTAINER.into(),
            state: Some(ContainerState {
                running: Some(ContainerStateRunning::default()),
                ..ContainerState::default()
            }),
            ..ContainerStatus::default()
        }]),
        ..PodStatus::default()
    });
    p
}

#[test]
fn a_warm_session_pod_is_the_pod_of_a_default_session_without_session_data() {
    let config = warm_config(1);
    let s = session(600);
    let own = session_pod(&s, &config).unwrap();
    let warm = warm_pod("warm-session-1", &config);
    // Same spec but for the uid (derived from the pod's name).
    assert_eq!(
        warmpool::pod_spec_hash(&own),
        warmpool::pod_spec_hash(&warm)
    );
    let uid = |p: &Pod| {
        p.spec
            .as_ref()
            .and_then(|s| s.security_context.as_ref())
            .and_then(|c| c.run_as_user)
    };
    assert_ne!(uid(&own), uid(&warm), "a uid of its own");
    // Nothing of any session: no owner, no session or tenant label, the pool's labels.
    let v = serde_json::to_value(&warm).unwrap();
    assert!(v["metadata"]["ownerReferences"].is_null(), "{v}");
    let labels = v["metadata"]["labels"].as_object().unwrap();
    assert!(!labels.contains_key(labels::SESSION), "{labels:?}");
    assert!(!labels.contains_key(labels::TENANT), "{labels:?}");
    assert_eq!(labels[labels::WARM_POOL], warmpool::SESSION_POOL);
    // Selected by the sandbox's deny-all NetworkPolicy like every sandbox pod (a warm
    // session pod without it had the pod network).
    assert_eq!(labels[labels::SANDBOX], labels::SANDBOX_VALUE, "{labels:?}");
    assert_eq!(
        labels[labels::SANDBOX],
        v_own_sandbox_label(&own),
        "the same as a session's own pod"
    );
    assert!(is_session_pool_pod(&warm));
    // Its agent serves the workspace like a session pod's, with the default size.
    let cmd = &v["spec"]["containers"][0]["command"];
    assert!(
        cmd.to_string().contains(&format!(
            "\"--workspace\",\"/workspace\",\"--workspace-limit-bytes\",\"{}\"",
            u64::from(config.session_workspace_mib) << 20
        )),
        "{cmd}"
    );
}

#[test]
fn only_sessions_whose_pod_would_be_the_warm_one_take_it() {
    let config = warm_config(1);
    assert!(takes_warm_pod(&session(600), &config));
    // Control: no session pool.
    assert!(!takes_warm_pod(&session(600), &OperatorConfig::default()));
    // Another workspace size, a claim, other limits: a pod of its own.
    let mut s = session(600);
    s.spec.workspace.size_mib = Some(512);
    assert!(!takes_warm_pod(&s, &config));
    // ... unless that is the configured size of warm session pods.
    let sized = OperatorConfig {
        session_workspace_mib: 512,
        ..config.clone()
    };
    assert!(takes_warm_pod(&s, &sized));
    let mut s = session(600);
    s.spec.workspace.size_mib = Some(config.session_workspace_mib);
    assert!(takes_warm_pod(&s, &config), "the default size, said");
    let mut s = session(600);
    s.spec.workspace.storage_class_name = Some("standard".into());
    assert!(!takes_warm_pod(&s, &config));
    let mut s = session(600);
    s.spec.limits.memory_mib = Some(config.default_limits.memory_mib / 2);
    assert!(!takes_warm_pod(&s, &config));
    // The idle timeout and approval mode are the gateway's: they do not matter.
    let mut s = session(60);
    s.spec.approval_mode = toolrun_crd::session::SessionApprovalMode::None;
    assert!(takes_warm_pod(&s, &config));
}

#[test]
fn a_session_records_the_warm_pod_then_claims_it_then_is_ready_on_it() {
    let config = warm_config(1);
    let mut s = session(600);
    let warm = warm_pod("warm-session-1", &config);
    // No pod: the offered warm pod is recorded first (nothing claimed, nothing sent).
    assert_eq!(
        decide(&s, None, Some(&warm), ts(1), GRACE),
        SessionDecision::Bind("warm-session-1".into())
    );
    s.status = Some(ToolSessionStatus {
        phase: Some(SessionPhase::Pending),
        pod_name: Some("warm-session-1".into()),
        ..ToolSessionStatus::default()
    });
    assert_eq!(pod_name(&s), "warm-session-1");
    // Recorded and still free: claimed at the version it was seen at.
    assert_eq!(
        decide(&s, Some(&warm), None, ts(2), GRACE),
        SessionDecision::Claim {
            pod: "warm-session-1".into(),
            resource_version: "41".into()
        }
    );
    // Once recorded, never another warm pod: the offer is ignored.
    let other = warm_pod("warm-session-2", &config);
    assert_eq!(
        decide(&s, None, Some(&other), ts(2), GRACE),
        SessionDecision::CreatePod,
        "the recorded pod went: a pod of its own"
    );
    // Claimed (owner and labels): Ready on the warm pod.
    let mut claimed = warm.clone();
    claimed.metadata.owner_references = Some(vec![owner(&s)]);
    match decide(&s, Some(&claimed), None, ts(3), GRACE) {
        SessionDecision::Status(st) => {
            assert_eq!(st.phase, Some(SessionPhase::Ready));
            assert_eq!(st.pod_name.as_deref(), Some("warm-session-1"));
        }
        d => panic!("{d:?}"),
    }
}

#[test]
fn a_warm_pod_taken_failing_or_going_before_the_claim_means_a_pod_of_its_own() {
    let config = warm_config(1);
    let mut s = session(600);
    s.status = Some(ToolSessionStatus {
        phase: Some(SessionPhase::Pending),
        pod_name: Some("warm-session-1".into()),
        ..ToolSessionStatus::default()
    });
    let warm = warm_pod("warm-session-1", &config);
    // Taken by another session.
    let mut taken = warm.clone();
    taken.metadata.owner_references = Some(vec![OwnerReference {
        uid: "other".into(),
        controller: Some(true),
        ..owner(&s)
    }]);
    assert_eq!(
        decide(&s, Some(&taken), None, ts(2), GRACE),
        SessionDecision::CreatePod
    );
    // Its agent stopped.
    let mut failing = warm.clone();
    failing.status.as_mut().unwrap().phase = Some("Failed".into());
    assert_eq!(
        decide(&s, Some(&failing), None, ts(2), GRACE),
        SessionDecision::CreatePod
    );
    // Being deleted.
    let mut going = warm.clone();
    going.metadata.deletion_timestamp = Some(Time(ts(1)));
    assert_eq!(
        decide(&s, Some(&going), None, ts(2), GRACE),
        SessionDecision::CreatePod
    );
    // A one-shot pool's pod is never a session's (control: the session pool's is).
    let mut python = warm.clone();
    python
        .metadata
        .labels
        .as_mut()
        .unwrap()
        .insert(labels::WARM_POOL.into(), "python".into());
    assert_eq!(
        decide(&s, Some(&python), None, ts(2), GRACE),
        SessionDecision::CreatePod
    );
    assert!(matches!(
        decide(&s, Some(&warm), None, ts(2), GRACE),
        SessionDecision::Claim { .. }
    ));
    // A pod named after the session that is not its own is still an error.
    let mut s2 = session(600);
    s2.metadata.uid = Some("another-uid".into());
    let squatter = session_pod(&session(600), &config).unwrap();
    assert!(matches!(
        decide(&s2, Some(&squatter), None, ts(2), GRACE),
        SessionDecision::Status(ToolSessionStatus {
            phase: Some(SessionPhase::Failed),
            ..
        })
    ));
}

/// The CPU, memory request and limit of every container (init containers too) of `p`.
fn cpu_and_memory(p: &Pod) -> Vec<(String, String, String, String)> {
    let spec = p.spec.as_ref().unwrap();
    let inits = spec.init_containers.iter().flatten();
    inits
        .chain(spec.containers.iter())
        .map(|c| {
            let r = c.resources.as_ref().unwrap();
            let get =
                |m: &Option<BTreeMap<String, Quantity>>, k: &str| m.as_ref().unwrap()[k].0.clone();
            (
                get(&r.requests, "cpu"),
                get(&r.limits, "cpu"),
                get(&r.requests, "memory"),
                get(&r.limits, "memory"),
            )
        })
        .collect()
}

#[test]
fn session_pods_may_request_less_cpu_than_their_limit_and_warm_ones_alike() {
    // Control: without sessionCpuRequestMillis a session pod is Guaranteed.
    let guaranteed = session_pod(&session(600), &OperatorConfig::default()).unwrap();
    for (req, lim, mreq, mlim) in cpu_and_memory(&guaranteed) {
        assert_eq!((req, mreq), (lim, mlim));
    }
    let config = OperatorConfig {
        session_cpu_request_millis: Some(50),
        ..warm_config(1)
    };
    let own = session_pod(&session(600), &config).unwrap();
    let containers = cpu_and_memory(&own);
    assert!(!containers.is_empty());
    for (req, lim, mreq, mlim) in containers {
        assert_eq!(req, "50m");
        assert_eq!(lim, format!("{}m", config.default_limits.cpu_millis));
        assert_eq!(mreq, mlim, "memory stays requested in full");
    }
    // The warm session pod is made alike, so sessions still take it.
    let warm = warm_pod("warm-session-1", &config);
    assert_eq!(cpu_and_memory(&warm), cpu_and_memory(&own));
    assert!(takes_warm_pod(&session(600), &config));
    // Never more than the limit: a session limited to 20m requests 20m.
    let mut small = session(600);
    small.spec.limits.cpu_millis = Some(20);
    let p = session_pod(&small, &config).unwrap();
    for (req, lim, _, _) in cpu_and_memory(&p) {
        assert_eq!((req.as_str(), lim.as_str()), ("20m", "20m"));
    }
}

fn v_own_sandbox_label(p: &Pod) -> String {
    p.labels()[labels::SANDBOX].clone()
}

/// A session's pod without the sandbox label (a warm pod of an earlier version, or a label a
/// person removed) is not selected by the deny-all NetworkPolicy: the label is put back
/// before anything else, and the session is not Ready on it until then. Control: the same
/// pod with the label is Ready.
#[test]
fn a_session_pod_without_the_sandbox_label_is_labelled_before_it_is_ready() {
    let s = session(600);
    let mut running = pod_of(&s, "Running", true);
    running
        .metadata
        .labels
        .as_mut()
        .unwrap()
        .remove(labels::SANDBOX);
    assert_eq!(
        decide(&s, Some(&running), None, ts(3), GRACE),
        SessionDecision::Isolate("ts-abc".into())
    );
    running
        .metadata
        .labels
        .as_mut()
        .unwrap()
        .insert(labels::SANDBOX.into(), "false".into());
    assert_eq!(
        decide(&s, Some(&running), None, ts(3), GRACE),
        SessionDecision::Isolate("ts-abc".into())
    );
    let labelled = pod_of(&s, "Running", true);
    match decide(&s, Some(&labelled), None, ts(3), GRACE) {
        SessionDecision::Status(st) => assert_eq!(st.phase, Some(SessionPhase::Ready)),
        d => panic!("{d:?}"),
    }
}

/// An idle Ready session is left alone: its status, written once with the expiry in whole
/// seconds (a Time's precision), matches a last-activity with milliseconds. (Compared
/// exactly, it was written again every second: two API requests per idle session per second.)
#[test]
fn a_ready_session_with_a_sub_second_last_activity_is_not_written_again() {
    let mut s = session(600);
    let used = ts(500)
        .checked_add(SignedDuration::from_millis(437))
        .unwrap();
    s.metadata.annotations = Some([(labels::LAST_ACTIVITY.to_string(), used.to_string())].into());
    let running = pod_of(&s, "Running", true);
    let SessionDecision::Status(mut st) = decide(&s, Some(&running), None, ts(501), GRACE) else {
        panic!("a new Ready status is written first");
    };
    // As it reads back from the API server: times in whole seconds.
    let whole = |t: Timestamp| Time(Timestamp::from_second(t.as_second()).unwrap());
    st.expires_at = expires_at(&s).map(whole);
    st.last_activity = last_activity(&s).map(whole);
    s.status = Some(st);
    assert_eq!(
        decide(&s, Some(&running), None, ts(502), GRACE),
        SessionDecision::Wait(RESYNC)
    );
    // Control: used again a second later, the expiry moves and is written.
    let later = used.checked_add(SignedDuration::from_secs(1)).unwrap();
    s.metadata.annotations = Some([(labels::LAST_ACTIVITY.to_string(), later.to_string())].into());
    assert!(matches!(
        decide(&s, Some(&running), None, ts(502), GRACE),
        SessionDecision::Status(_)
    ));
}
