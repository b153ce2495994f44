use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateRunning, ContainerStatus, PodStatus,
};
use toolrun_crd::session::{SessionWorkspace, ToolSessionSpec};

use super::*;
use crate::builders::AGENT_CONTAINER;

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
    assert_eq!(decide(&s, None, ts(1), GRACE), SessionDecision::CreatePod);
    let starting = pod_of(&s, "Pending", false);
    match decide(&s, Some(&starting), ts(2), GRACE) {
        SessionDecision::Status(st) => assert_eq!(st.phase, Some(SessionPhase::Pending)),
        d => panic!("{d:?}"),
    }
    let running = pod_of(&s, "Running", true);
    match decide(&s, Some(&running), ts(3), GRACE) {
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
    assert_eq!(decide(&s, None, ts(600), GRACE), SessionDecision::Expire);
    // Control: used at 500 s, it lives until 1100 s.
    s.metadata.annotations =
        Some([(labels::LAST_ACTIVITY.to_string(), ts(500).to_string())].into());
    assert_eq!(expires_at(&s), Some(ts(1100)));
    assert_eq!(decide(&s, None, ts(600), GRACE), SessionDecision::CreatePod);
    assert_eq!(decide(&s, None, ts(1100), GRACE), SessionDecision::Expire);
}

#[test]
fn a_lost_pod_fails_an_emptydir_session_and_is_remade_on_a_claim() {
    let mut s = session(600);
    s.status = Some(ToolSessionStatus {
        phase: Some(SessionPhase::Ready),
        pod_name: Some("ts-abc".into()),
        ..ToolSessionStatus::default()
    });
    match decide(&s, None, ts(5), GRACE) {
        SessionDecision::Status(st) => {
            assert_eq!(st.phase, Some(SessionPhase::Failed));
            assert!(st.message.unwrap().contains("disappeared"));
        }
        d => panic!("{d:?}"),
    }
    let failed = pod_of(&s, "Failed", false);
    assert!(matches!(
        decide(&s, Some(&failed), ts(5), GRACE),
        SessionDecision::Status(ToolSessionStatus {
            phase: Some(SessionPhase::Failed),
            ..
        })
    ));
    s.spec.workspace.storage_class_name = Some("standard".into());
    assert_eq!(decide(&s, None, ts(5), GRACE), SessionDecision::CreatePod);
    let failed = pod_of(&s, "Failed", false);
    assert_eq!(
        decide(&s, Some(&failed), ts(5), GRACE),
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
    assert_eq!(&cmd[1..], ["agent", "--workspace", "/workspace"]);
    assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true);
    let ws = spec["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "workspace")
        .unwrap();
    assert_eq!(ws["emptyDir"]["sizeLimit"], "256Mi");
    // The emptyDir counts against the pod's ephemeral storage: it grows by as much.
    assert_eq!(c["resources"]["limits"]["ephemeral-storage"], "320Mi");
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
    let claim = serde_json::to_value(workspace_claim(&s)).unwrap();
    assert_eq!(claim["spec"]["resources"]["requests"]["storage"], "1024Mi");
    assert_eq!(claim["spec"]["storageClassName"], "standard");
    // A RuntimeClass the operator does not allow is refused.
    let mut s = session(600);
    s.spec.runtime_class_name = Some("weak".into());
    assert!(session_pod(&s, &OperatorConfig::default()).is_err());
}
