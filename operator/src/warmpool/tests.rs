use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateRunning, ContainerStatus, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use k8s_openapi::jiff::Timestamp;

use super::*;

fn pod(name: &str, lang: &str, hash: &str, phase: &str) -> Arc<Pod> {
    Arc::new(Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(BTreeMap::from([
                (labels::WARM_POOL.to_string(), lang.to_string()),
                (SPEC_HASH.to_string(), hash.to_string()),
            ])),
            ..ObjectMeta::default()
        },
        spec: None,
        status: Some(PodStatus {
            phase: Some(phase.into()),
            container_statuses: Some(vec![ContainerStatus {
                name: builders::AGENT_CONTAINER.into(),
                state: Some(ContainerState {
                    running: (phase == "Running").then(ContainerStateRunning::default),
                    ..ContainerState::default()
                }),
                ..ContainerStatus::default()
            }]),
            ..PodStatus::default()
        }),
    })
}

fn sizes(n: u32) -> BTreeMap<String, u32> {
    BTreeMap::from([("python".to_string(), n)])
}

fn hashes() -> BTreeMap<String, String> {
    BTreeMap::from([("python".to_string(), "h1".to_string())])
}

#[test]
fn an_empty_pool_is_filled_counting_pods_on_their_way() {
    let p = plan(&[], &sizes(2), &hashes(), &BTreeMap::new());
    assert_eq!(p.create, BTreeMap::from([("python".to_string(), 2)]));
    assert!(p.delete.is_empty());
    let coming = BTreeMap::from([("python".to_string(), 1)]);
    let p = plan(
        &[pod("a", "python", "h1", "Pending")],
        &sizes(2),
        &hashes(),
        &coming,
    );
    assert_eq!(p, Plan::default());
}

#[test]
fn claimed_pods_do_not_count_and_are_left_to_their_run() {
    let mut claimed = (*pod("a", "python", "h1", "Running")).clone();
    claimed.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "toolrun.dev/v1alpha1".into(),
        kind: "ToolRun".into(),
        name: "r".into(),
        uid: "u".into(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }]);
    let mut claimed_failed = claimed.clone();
    claimed_failed.metadata.name = Some("b".into());
    claimed_failed.status.as_mut().unwrap().phase = Some("Failed".into());
    let p = plan(
        &[Arc::new(claimed), Arc::new(claimed_failed)],
        &sizes(2),
        &hashes(),
        &BTreeMap::new(),
    );
    assert_eq!(p.create, BTreeMap::from([("python".to_string(), 2)]));
    assert!(p.delete.is_empty(), "{p:?}");
}

#[test]
fn failed_stale_and_unwanted_pods_are_replaced() {
    let mut going = (*pod("going", "python", "h1", "Running")).clone();
    going.metadata.deletion_timestamp = Some(Time(Timestamp::now()));
    let pods = [
        pod("ok", "python", "h1", "Running"),
        pod("failed", "python", "h1", "Failed"),
        pod("stale", "python", "h0", "Running"),
        pod("js", "javascript", "h1", "Running"),
        Arc::new(going),
    ];
    let p = plan(&pods, &sizes(2), &hashes(), &BTreeMap::new());
    assert_eq!(p.delete, vec!["failed", "js", "stale"]);
    assert_eq!(p.create, BTreeMap::from([("python".to_string(), 1)]));
}

#[test]
fn a_smaller_size_deletes_the_pods_not_ready_first() {
    let pods = [
        pod("a", "python", "h1", "Running"),
        pod("b", "python", "h1", "Pending"),
        pod("c", "python", "h1", "Running"),
    ];
    let p = plan(&pods, &sizes(1), &hashes(), &BTreeMap::new());
    assert_eq!(p.delete, vec!["a", "b"]);
    assert!(p.create.is_empty());
    let p = plan(&pods, &sizes(0), &hashes(), &BTreeMap::new());
    assert_eq!(p.delete, vec!["a", "b", "c"]);
}

#[test]
fn warm_pods_carry_their_pool_and_spec_hash_and_no_run_data() {
    let mut config = OperatorConfig::default();
    config.warm_pool.insert("python".into(), 2);
    let h = spec_hash("python", &config).unwrap();
    assert_eq!(h.len(), 16);
    // The same configuration gives the same hash whatever the pod's name.
    assert_eq!(spec_hash("python", &config).unwrap(), h);
    let p = warm_pod("warm-python-x", "python", &h, &config).unwrap();
    assert_eq!(p.labels()[labels::WARM_POOL], "python");
    assert_eq!(p.labels()[SPEC_HASH], h);
    assert!(p.owner_references().is_empty());
    // Another image or default memory: another hash (old pods get replaced).
    let mut other = config.clone();
    other.default_limits.memory_mib += 1;
    assert_ne!(spec_hash("python", &other).unwrap(), h);
    let mut image = config.clone();
    image.images.python.image = "registry.example/other:1".into();
    assert_ne!(spec_hash("python", &image).unwrap(), h);
}
