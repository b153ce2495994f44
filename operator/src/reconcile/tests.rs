use std::time::Duration;

use futures::StreamExt;
use kube::runtime::{reflector, watcher};
use toolrun_crd::{ToolRun, ToolRunStatus};
use toolrun_runner::RunRecord;

use super::*;
use crate::toolrun::record::tests::record;

fn run(name: &str, rv: Option<&str>) -> ToolRun {
    let mut r: ToolRun = serde_json::from_value(serde_json::json!({
        "apiVersion": "toolrun.dev/v1alpha1",
        "kind": "ToolRun",
        "metadata": {"name": name, "namespace": "ns"},
        "spec": {"language": "python", "code": "print(1)"},
    }))
    .expect("a ToolRun");
    r.metadata.resource_version = rv.map(String::from);
    r
}

#[test]
fn the_backoff_doubles_up_to_its_cap_and_starts_again_after_a_success() {
    let b = Backoff::new(Duration::from_millis(500), Duration::from_secs(60));
    let delays: Vec<_> = (0..9).map(|_| b.failed("r").1).collect();
    assert_eq!(
        delays,
        [500, 1000, 2000, 4000, 8000, 16_000, 32_000, 60_000, 60_000].map(Duration::from_millis)
    );
    assert_eq!(
        b.failed("other"),
        (1, Duration::from_millis(500)),
        "per object"
    );
    b.succeeded("r");
    assert_eq!(b.failed("r"), (1, Duration::from_millis(500)));
    // Many failures in a row: no overflow, still the cap.
    for _ in 0..100 {
        b.failed("r");
    }
    assert_eq!(b.failed("r"), (102, Duration::from_secs(60)));
    let fixed = Backoff::new(Duration::from_secs(2), Duration::from_secs(2));
    assert_eq!(fixed.failed("s").1, Duration::from_secs(2));
    assert_eq!(fixed.failed("s"), (2, Duration::from_secs(2)));
}

#[test]
fn the_status_patch_carries_the_resource_version_read() {
    let status = ToolRunStatus {
        reason: Some("why".into()),
        ..ToolRunStatus::default()
    };
    let patch = status_patch(&run("r1", Some("42")), &status);
    assert_eq!(patch["apiVersion"], "toolrun.dev/v1alpha1");
    assert_eq!(patch["kind"], "ToolRun");
    assert_eq!(patch["metadata"]["name"], "r1");
    assert_eq!(patch["metadata"]["resourceVersion"], "42");
    assert_eq!(patch["status"]["reason"], "why");
    assert_eq!(
        patch["metadata"].as_object().map(|m| m.len()),
        Some(2),
        "only the name and the version: nothing else of the object is claimed"
    );
}

#[test]
fn event_notes_are_cut_on_a_character_boundary() {
    assert_eq!(cut_note("short".into()), "short");
    let exact = "a".repeat(MAX_NOTE_BYTES);
    assert_eq!(cut_note(exact.clone()), exact);
    // 999 ASCII bytes, then a 3-byte character across the limit: it goes whole.
    let note = format!("{}€€", "a".repeat(MAX_NOTE_BYTES - 1));
    let cut = cut_note(note);
    assert_eq!(cut, "a".repeat(MAX_NOTE_BYTES - 1));
}

#[test]
fn the_memo_takes_the_cache_unless_this_process_saw_a_newer_version() {
    let fresh: Fresh<ToolRun> = Fresh::new("ns".into());
    // Nothing remembered: the cache's copy, whatever its version.
    assert!(!fresh.is_stale("r", &run("r", Some("5"))));
    fresh.remember("r", &run("r", Some("7")));
    assert!(
        fresh.is_stale("r", &run("r", Some("5"))),
        "cache behind our write"
    );
    assert!(fresh.is_stale("r", &run("r", None)));
    assert!(
        !fresh.is_stale("r", &run("r", Some("7"))),
        "cache caught up"
    );
    assert!(!fresh.is_stale("other", &run("other", Some("1"))));
    // A copy without a version is not remembered.
    fresh.remember("s", &run("s", None));
    assert!(!fresh.is_stale("s", &run("s", Some("1"))));
    fresh.forget("r");
    assert!(!fresh.is_stale("r", &run("r", Some("5"))));
}

#[test]
fn the_memo_drops_objects_gone_from_the_cache_once_it_outgrows_it() {
    let fresh: Fresh<ToolRun> = Fresh::new("ns".into());
    let (store, mut writer) = reflector::store::<ToolRun>();
    writer.apply_watcher_event(&watcher::Event::Apply(run("kept", Some("1"))));
    fresh.set_store(store);
    fresh.remember("kept", &run("kept", Some("2")));
    for i in 0..1024 {
        fresh.remember(&format!("gone-{i}"), &run("x", Some("1")));
    }
    // 1025 entries: past the floor of 1024, so pruned to what the cache holds.
    assert_eq!(fresh.len(), 1);
    assert!(fresh.is_stale("kept", &run("kept", Some("1"))));
    // Below the floor nothing is pruned.
    for i in 0..10 {
        fresh.remember(&format!("gone-{i}"), &run("x", Some("1")));
    }
    assert_eq!(fresh.len(), 11);
}

type Tasks = PodTasks<ToolRun, Option<RunRecord>>;

#[test]
fn a_pod_gets_one_task_per_term_and_none_between_terms_or_past_the_limit() {
    let tasks = Tasks::new("ns".into());
    assert_eq!(tasks.begin("u1", "r1", 2).err(), Some(Refused::NoTerm));
    let _rx = tasks.start_term();
    let c1 = tasks.begin("u1", "r1", 2).expect("first");
    assert_eq!(tasks.begin("u1", "r1", 2).err(), Some(Refused::Known));
    let _c2 = tasks.begin("u2", "r2", 2).expect("second");
    assert_eq!(tasks.begin("u3", "r3", 2).err(), Some(Refused::Full));
    assert_eq!(tasks.live(), 2);
    // An ended task is no longer live but its pod stays known.
    tasks.ended("u2", "r2", None, false);
    assert_eq!(tasks.live(), 1);
    assert_eq!(tasks.begin("u2", "r2", 2).err(), Some(Refused::Known));
    tasks.forget_run("r1");
    assert!(c1.is_cancelled());
    assert_eq!(tasks.live(), 0);
    let c3 = tasks.begin("u3", "r3", 2).expect("room again");
    tasks.end_term();
    assert!(c3.is_cancelled());
    assert_eq!(tasks.begin("u4", "r4", 2).err(), Some(Refused::NoTerm));
    let _rx = tasks.start_term();
    assert!(
        tasks.begin("u2", "r2", 2).is_ok(),
        "a new term forgets the pods"
    );
}

#[tokio::test]
async fn an_outcome_is_kept_by_pod_uid_and_triggers_a_look_when_asked() {
    let tasks = Tasks::new("ns".into());
    let mut rx = tasks.start_term();
    tasks.begin("u1", "r1", 4).expect("begin");
    tasks.begin("u2", "r2", 4).expect("begin");
    tasks.ended("u1", "r1", Some(record("1\n")), true);
    tasks.ended("u2", "r2", None, false);
    let looked = tokio::time::timeout(Duration::from_secs(5), rx.next())
        .await
        .expect("a trigger")
        .expect("open");
    assert_eq!(looked.name, "r1");
    assert_eq!(looked.namespace.as_deref(), Some("ns"));
    assert_eq!(tasks.outcome("u1"), Some(Some(record("1\n"))));
    assert_eq!(tasks.outcome("u2"), Some(None));
    assert_eq!(tasks.outcome("u3"), None);
    // Nothing else was triggered.
    assert!(
        tokio::time::timeout(Duration::from_millis(50), rx.next())
            .await
            .is_err()
    );
    // An outcome arriving after its run was forgotten is dropped.
    tasks.begin("u5", "r5", 4).expect("begin");
    tasks.forget_run("r5");
    tasks.ended("u5", "r5", Some(record("1\n")), true);
    assert_eq!(tasks.outcome("u5"), None);
}
