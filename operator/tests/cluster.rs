//! The operator against the real API server: each test makes its own namespace, runs the
//! operator in-process for that namespace, creates ToolRuns through the API (as
//! `kubectl apply` would) and waits, with deadlines, for what a user would check.
//!
//! Without a cluster these tests print SKIPPED and pass, unless
//! `TOOLRUN_REQUIRE_CLUSTER=1`: `eval "$(tests/cluster/env)"; TOOLRUN_REQUIRE_CLUSTER=1
//! cargo test -p toolrun-operator`.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, anyhow, bail, ensure};
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, CustomResourceExt, ResourceExt};
use serde_json::json;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use toolrun_crd::{Phase, ToolRun, Verdict};
use toolrun_e2e::{TestNs, run_in_namespace, wait_until};
use toolrun_operator::toolrun::decide::RETRIED;
use toolrun_operator::{Config, Identity};

/// A run of `print(1)` on the warm node takes 1-3 s; this leaves room for a loaded
/// machine without hiding a hang.
const RUN_DEADLINE: Duration = Duration::from_secs(90);

/// The CRD, installed when missing (the chart or `kubectl apply -f deploy/crds` may have
/// done it already).
async fn ensure_crd(client: &Client) -> Result<()> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let name = "toolruns.toolrun.dev";
    if crds.get_opt(name).await?.is_none() {
        match crds.create(&PostParams::default(), &ToolRun::crd()).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => return Err(e).context("installing the ToolRun CRD"),
        }
    }
    wait_until(
        Duration::from_secs(30),
        "the ToolRun CRD established",
        || async {
            let crd = crds.get(name).await?;
            Ok(crd.status.and_then(|s| s.conditions).is_some_and(|cs| {
                cs.iter()
                    .any(|c| c.type_ == "Established" && c.status == "True")
            }))
        },
    )
    .await
}

/// The operator's configuration for a test namespace.
fn test_config(ns: &str) -> Config {
    let mut c = Config::default();
    c.operator.namespace = ns.into();
    c.operator.default_ttl_seconds_after_finished = 600;
    c.controller.leader_election.enabled = false;
    c.controller.metrics_listen = "127.0.0.1:0".parse().unwrap();
    c.controller.pending_grace = Duration::from_secs(3);
    c
}

/// An operator running in-process.
struct Operator {
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<Result<(), toolrun_operator::Error>>,
}

impl Operator {
    async fn start(config: Config, identity: &str) -> Result<Operator> {
        let client = toolrun_operator::client(&config.controller).await?;
        let (tx, rx) = oneshot::channel();
        let identity = Identity {
            name: identity.into(),
            lease_namespace: config.operator.namespace.clone(),
        };
        let task = tokio::spawn(toolrun_operator::run(
            client,
            config.operator,
            config.controller,
            identity,
            async move {
                let _ = rx.await;
            },
        ));
        Ok(Operator {
            stop: Some(tx),
            task,
        })
    }

    /// Graceful stop (as on SIGTERM): in-flight reconciles finish, the lease is released.
    async fn stop(mut self) -> Result<()> {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        tokio::time::timeout(Duration::from_secs(30), &mut self.task)
            .await
            .map_err(|_| anyhow!("the operator did not stop within 30 s"))???;
        Ok(())
    }

    /// Killed at whatever line it is on.
    fn kill(self) {
        self.task.abort();
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn toolrun(name: &str, language: &str, code: &str, extra: serde_json::Value) -> Result<ToolRun> {
    let mut spec = json!({
        "tool": "run_code",
        "callId": format!("call {name}"),
        "language": language,
        "code": code,
    });
    if let (Some(s), Some(e)) = (spec.as_object_mut(), extra.as_object()) {
        for (k, v) in e {
            s.insert(k.clone(), v.clone());
        }
    }
    Ok(serde_json::from_value(json!({
        "apiVersion": "toolrun.dev/v1alpha1",
        "kind": "ToolRun",
        "metadata": {"name": name},
        "spec": spec,
    }))?)
}

async fn create(ns: &TestNs, run: &ToolRun) -> Result<ToolRun> {
    ns.api::<ToolRun>()
        .create(&PostParams::default(), run)
        .await
        .with_context(|| format!("creating ToolRun {}", run.name_any()))
}

/// Waits until the ToolRun's status says finished; returns it.
async fn finished(ns: &TestNs, name: &str) -> Result<ToolRun> {
    wait_status(ns, name, "finished", |s| {
        s.phase.is_some_and(Phase::is_finished)
    })
    .await
}

async fn wait_status(
    ns: &TestNs,
    name: &str,
    what: &str,
    cond: impl Fn(&toolrun_crd::ToolRunStatus) -> bool,
) -> Result<ToolRun> {
    let api = ns.api::<ToolRun>();
    let deadline = Instant::now() + RUN_DEADLINE;
    loop {
        let run = api.get(name).await?;
        if run.status.as_ref().is_some_and(&cond) {
            return Ok(run);
        }
        if Instant::now() >= deadline {
            bail!(
                "timed out after {RUN_DEADLINE:?} waiting for ToolRun {name} {what}; status: {:?}",
                run.status
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn status(run: &ToolRun) -> &toolrun_crd::ToolRunStatus {
    run.status.as_ref().expect("a status")
}

async fn pods_of(ns: &TestNs, run: &str) -> Result<Vec<Pod>> {
    Ok(ns
        .pods()
        .list(&ListParams::default().labels(&format!("toolrun.dev/run={run}")))
        .await?
        .items)
}

/// Events the operator reported about `run`, as (reason, reporting instance), one entry
/// per occurrence (the recorder folds repeats into a series).
async fn events_of(ns: &TestNs, run: &str) -> Result<Vec<(String, String)>> {
    let events: Api<Event> = ns.api();
    Ok(events
        .list(&ListParams::default())
        .await?
        .into_iter()
        .filter(|e| {
            e.regarding.as_ref().is_some_and(|r| {
                r.kind.as_deref() == Some("ToolRun") && r.name.as_deref() == Some(run)
            })
        })
        .flat_map(|e| {
            let n = e.series.as_ref().map_or(1, |s| s.count.max(1)) as usize;
            let one = (
                e.reason.unwrap_or_default(),
                e.reporting_instance.unwrap_or_default(),
            );
            std::iter::repeat_n(one, n)
        })
        .collect())
}

async fn gone<K>(api: &Api<K>, name: &str, what: &str) -> Result<()>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    wait_until(RUN_DEADLINE, what, || async {
        Ok(api.get_opt(name).await?.is_none())
    })
    .await
}

/// Runs `body` in a fresh namespace with the CRD installed.
async fn with_ns<F, Fut>(test: &str, body: F)
where
    F: FnOnce(TestNs) -> Fut,
    Fut: Future<Output = Result<()>>,
{
    run_in_namespace(test, |ns| async move {
        ensure_crd(&ns.client).await?;
        body(ns).await
    })
    .await;
}

#[tokio::test]
async fn python_print_runs_in_a_locked_down_pod() {
    with_ns("op-python", |ns| async move {
        let op = Operator::start(test_config(&ns.name), "op-1").await?;
        create(&ns, &toolrun("py", "python", "print(1)", json!({}))?).await?;
        let run = finished(&ns, "py").await?;
        let s = status(&run);
        assert_eq!(s.phase, Some(Phase::Succeeded), "{s:?}");
        assert_eq!(s.verdict, Some(Verdict::Ok));
        assert_eq!(s.exit_code, Some(0));
        assert_eq!(s.stdout.as_deref(), Some("1\n"));
        assert_eq!(s.stderr.as_deref(), Some(""));
        assert_eq!(s.pod_name.as_deref(), Some("py"));
        assert!(
            s.start_time.is_some() && s.completion_time.is_some(),
            "{s:?}"
        );
        assert!(s.duration_ms.is_some());
        assert_eq!(s.observed_generation, run.metadata.generation);
        let ready = s.conditions.iter().find(|c| c.type_ == "Ready").unwrap();
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("True", "Ok")
        );

        // The pod as the API server stored it: every locked-down field (one container: by
        // default the runner comes from the sandbox image).
        let pod = ns.pods().get("py").await?;
        assert_locked_down(&pod, &run, 1);
        // The ConfigMap holds the spec and belongs to the run too.
        let cm = ns.api::<ConfigMap>().get("py").await?;
        assert_eq!(cm.immutable, Some(true));
        assert!(cm.data.unwrap()["spec.json"].contains("print(1)"));
        assert_eq!(
            cm.metadata.owner_references.unwrap()[0].uid,
            run.uid().unwrap()
        );
        // The deny-all policy is in place.
        let np = ns
            .api::<k8s_openapi::api::networking::v1::NetworkPolicy>()
            .get("toolrun-sandbox-deny-all")
            .await?;
        assert_eq!(
            np.spec.unwrap().policy_types,
            Some(vec!["Ingress".to_string(), "Egress".to_string()])
        );
        // Events: created once, finished once.
        let reasons: Vec<String> = events_of(&ns, "py")
            .await?
            .into_iter()
            .map(|e| e.0)
            .collect();
        assert_eq!(
            reasons.iter().filter(|r| *r == "Created").count(),
            1,
            "{reasons:?}"
        );
        assert!(reasons.contains(&"Finished".to_string()), "{reasons:?}");
        op.stop().await
    })
    .await;
}

fn assert_locked_down(pod: &Pod, run: &ToolRun, n_containers: usize) {
    let spec = pod.spec.as_ref().unwrap();
    assert_eq!(spec.restart_policy.as_deref(), Some("Never"));
    assert!(spec.active_deadline_seconds.is_some_and(|d| d > 0));
    assert_eq!(spec.automount_service_account_token, Some(false));
    assert_eq!(spec.enable_service_links, Some(false));
    assert_eq!(spec.dns_policy.as_deref(), Some("None"));
    assert_ne!(spec.host_network, Some(true));
    assert_ne!(spec.host_pid, Some(true));
    assert_ne!(spec.host_ipc, Some(true));
    let psc = spec.security_context.as_ref().unwrap();
    assert_eq!(psc.run_as_non_root, Some(true));
    assert_eq!(
        psc.seccomp_profile.as_ref().unwrap().type_,
        "RuntimeDefault"
    );
    let labels = pod.labels();
    assert_eq!(labels["toolrun.dev/sandbox"], "true");
    assert_eq!(labels["toolrun.dev/run"], run.name_any());
    assert!(labels.contains_key("toolrun.dev/call-id"));
    let owner = &pod.owner_references()[0];
    assert_eq!(owner.uid, run.uid().unwrap());
    assert_eq!(owner.controller, Some(true));
    assert_eq!(owner.block_owner_deletion, Some(true));
    let containers = spec
        .init_containers
        .iter()
        .flatten()
        .chain(spec.containers.iter());
    let mut n = 0;
    for c in containers {
        n += 1;
        let sc = c.security_context.as_ref().unwrap();
        assert_eq!(sc.run_as_non_root, Some(true), "{}", c.name);
        assert_eq!(sc.read_only_root_filesystem, Some(true), "{}", c.name);
        assert_eq!(sc.allow_privilege_escalation, Some(false), "{}", c.name);
        assert_ne!(sc.privileged, Some(true), "{}", c.name);
        let caps = sc.capabilities.as_ref().unwrap();
        assert_eq!(caps.drop, Some(vec!["ALL".to_string()]), "{}", c.name);
        assert_eq!(caps.add, None, "{}", c.name);
        let r = c.resources.as_ref().unwrap();
        assert!(r.limits.is_some(), "{}", c.name);
        assert_eq!(r.requests, r.limits, "{}: requests != limits", c.name);
    }
    assert_eq!(n, n_containers);
    let tmp = spec
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == "tmp")
        .and_then(|v| v.empty_dir.as_ref())
        .unwrap();
    assert_eq!(tmp.medium.as_deref(), Some("Memory"));
    assert!(tmp.size_limit.is_some());
    assert_eq!(
        pod.status.as_ref().unwrap().qos_class.as_deref(),
        Some("Guaranteed")
    );
}

#[tokio::test]
async fn javascript_and_bash_report_stderr_and_exit_codes() {
    with_ns("op-js-bash", |ns| async move {
        // javascript from the runner toolrun/sandbox carries (runnerPath, the default: no
        // init container); bash with the init container that copies the runner in.
        let mut config = test_config(&ns.name);
        config.operator.images.bash.runner_path = None;
        let op = Operator::start(config, "op-1").await?;
        create(
            &ns,
            &toolrun(
                "js",
                "javascript",
                "console.log('to out'); console.error('to err'); process.exit(3)",
                json!({}),
            )?,
        )
        .await?;
        create(
            &ns,
            &toolrun(
                "sh",
                "bash",
                "echo \"$1 $MY_VAR\"; read line; echo \"got $line\" >&2; exit 7",
                json!({"args": ["arg1"], "env": [{"name": "MY_VAR", "value": "v"}], "stdin": "input\n"}),
            )?,
        )
        .await?;
        let js = finished(&ns, "js").await?;
        let s = status(&js);
        assert_eq!(s.verdict, Some(Verdict::RuntimeError), "{s:?}");
        assert_eq!(s.phase, Some(Phase::Failed));
        assert_eq!(s.exit_code, Some(3));
        assert_eq!(s.stdout.as_deref(), Some("to out\n"));
        assert_eq!(s.stderr.as_deref(), Some("to err\n"));
        let pod = ns.pods().get("js").await?;
        assert_locked_down(&pod, &js, 1);
        let command = &pod.spec.as_ref().unwrap().containers[0].command;
        assert_eq!(
            command.as_ref().unwrap()[0],
            toolrun_operator::config::SANDBOX_IMAGE_RUNNER
        );
        let sh = finished(&ns, "sh").await?;
        let pod = ns.pods().get("sh").await?;
        assert_locked_down(&pod, &sh, 2);
        let init = &pod.spec.as_ref().unwrap().init_containers.as_ref().unwrap()[0];
        assert_eq!(init.name, "install-runner");
        let init_exit = pod
            .status
            .as_ref()
            .and_then(|s| s.init_container_statuses.as_ref())
            .and_then(|s| s[0].state.as_ref())
            .and_then(|s| s.terminated.as_ref())
            .map(|t| t.exit_code);
        assert_eq!(init_exit, Some(0), "the init container copied the runner");
        let s = status(&sh);
        assert_eq!(s.verdict, Some(Verdict::RuntimeError), "{s:?}");
        assert_eq!(s.exit_code, Some(7));
        assert_eq!(s.stdout.as_deref(), Some("arg1 v\n"));
        assert_eq!(s.stderr.as_deref(), Some("got input\n"));
        op.stop().await
    })
    .await;
}

#[tokio::test]
async fn a_run_past_its_timeout_is_timeout() {
    with_ns("op-timeout", |ns| async move {
        let op = Operator::start(test_config(&ns.name), "op-1").await?;
        create(
            &ns,
            &toolrun(
                "slow",
                "python",
                "import time\nprint('start', flush=True)\ntime.sleep(120)",
                json!({"limits": {"timeoutSeconds": 2}}),
            )?,
        )
        .await?;
        let run = finished(&ns, "slow").await?;
        let s = status(&run);
        assert_eq!(s.verdict, Some(Verdict::Timeout), "{s:?}");
        assert_eq!(s.stdout.as_deref(), Some("start\n"));
        let ms = s.duration_ms.unwrap();
        assert!((2_000..10_000).contains(&ms), "duration {ms} ms");
        op.stop().await
    })
    .await;
}

#[tokio::test]
async fn a_memory_bomb_is_memory_limit() {
    with_ns("op-membomb", |ns| async move {
        let op = Operator::start(test_config(&ns.name), "op-1").await?;
        create(
            &ns,
            &toolrun(
                "bomb",
                "python",
                "x = 'a' * (1 << 30)\nprint(len(x))",
                json!({"limits": {"memoryMiB": 64, "timeoutSeconds": 30}}),
            )?,
        )
        .await?;
        let run = finished(&ns, "bomb").await?;
        let s = status(&run);
        assert_eq!(s.verdict, Some(Verdict::MemoryLimit), "{s:?}");
        assert_eq!(s.stdout.as_deref().unwrap_or(""), "");
        op.stop().await
    })
    .await;
}

#[tokio::test]
async fn cancel_stops_the_run_and_removes_its_pod() {
    with_ns("op-cancel", |ns| async move {
        let op = Operator::start(test_config(&ns.name), "op-1").await?;
        create(
            &ns,
            &toolrun(
                "c",
                "python",
                "import time\ntime.sleep(120)",
                json!({"limits": {"timeoutSeconds": 300}}),
            )?,
        )
        .await?;
        wait_status(&ns, "c", "Running", |s| s.phase == Some(Phase::Running)).await?;
        ns.api::<ToolRun>()
            .patch(
                "c",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"cancel": true}})),
            )
            .await?;
        let started = Instant::now();
        let run = finished(&ns, "c").await?;
        let s = status(&run);
        assert_eq!(s.verdict, Some(Verdict::Cancelled), "{s:?}");
        assert_eq!(s.phase, Some(Phase::Failed));
        gone(&ns.pods(), "c", "the cancelled pod deleted").await?;
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "{:?}",
            started.elapsed()
        );
        let reasons: Vec<String> = events_of(&ns, "c")
            .await?
            .into_iter()
            .map(|e| e.0)
            .collect();
        assert!(reasons.contains(&"Cancelled".to_string()), "{reasons:?}");
        op.stop().await
    })
    .await;
}

#[tokio::test]
async fn an_image_that_does_not_exist_is_an_infra_error() {
    with_ns("op-noimage", |ns| async move {
        let mut config = test_config(&ns.name);
        config.operator.images.python.image = "toolrun/does-not-exist:0.0.0".into();
        let op = Operator::start(config, "op-1").await?;
        create(&ns, &toolrun("img", "python", "print(1)", json!({}))?).await?;
        let run = finished(&ns, "img").await?;
        let s = status(&run);
        assert_eq!(s.verdict, Some(Verdict::InfraError), "{s:?}");
        let reason = s.reason.as_deref().unwrap_or("");
        assert!(
            reason.starts_with("image not found: toolrun/does-not-exist:0.0.0"),
            "{reason}"
        );
        gone(&ns.pods(), "img", "the stuck pod deleted").await?;
        op.stop().await
    })
    .await;
}

#[tokio::test]
async fn a_refused_spec_is_an_infra_error_without_a_pod() {
    with_ns("op-refused", |ns| async move {
        let op = Operator::start(test_config(&ns.name), "op-1").await?;
        // Valid for the CRD (at most 65536), above this operator's maximum (2048).
        create(
            &ns,
            &toolrun(
                "big",
                "python",
                "print(1)",
                json!({"limits": {"memoryMiB": 4096}}),
            )?,
        )
        .await?;
        let run = finished(&ns, "big").await?;
        let s = status(&run);
        assert_eq!(s.verdict, Some(Verdict::InfraError), "{s:?}");
        assert!(
            s.reason
                .as_deref()
                .unwrap_or("")
                .contains("limits.memoryMiB = 4096 is above the maximum 2048"),
            "{s:?}"
        );
        assert!(pods_of(&ns, "big").await?.is_empty());
        op.stop().await
    })
    .await;
}

#[tokio::test]
async fn killing_the_operator_mid_run_loses_nothing_and_makes_no_second_pod() {
    with_ns("op-kill", |ns| async move {
        let op = Operator::start(test_config(&ns.name), "op-1").await?;
        create(
            &ns,
            &toolrun(
                "k",
                "python",
                "import time\ntime.sleep(4)\nprint('done')",
                json!({}),
            )?,
        )
        .await?;
        wait_status(&ns, "k", "Running", |s| s.phase == Some(Phase::Running)).await?;
        let first = ns.pods().get("k").await?;
        op.kill();
        let op = Operator::start(test_config(&ns.name), "op-2").await?;
        let run = finished(&ns, "k").await?;
        let s = status(&run);
        assert_eq!(s.verdict, Some(Verdict::Ok), "{s:?}");
        assert_eq!(s.stdout.as_deref(), Some("done\n"));
        let pods = pods_of(&ns, "k").await?;
        assert_eq!(pods.len(), 1, "exactly one pod");
        assert_eq!(pods[0].uid(), first.uid(), "the same pod");
        let created = events_of(&ns, "k")
            .await?
            .into_iter()
            .filter(|e| e.0 == "Created")
            .count();
        assert_eq!(created, 1, "one pod ever created");
        op.stop().await
    })
    .await;
}

#[tokio::test]
async fn after_the_ttl_the_run_its_pod_and_config_map_are_gone() {
    with_ns("op-ttl", |ns| async move {
        let op = Operator::start(test_config(&ns.name), "op-1").await?;
        create(
            &ns,
            &toolrun(
                "t",
                "python",
                "print(1)",
                // Long enough to see it finished before it goes (1 s raced the poll).
                json!({"ttlSecondsAfterFinished": 4}),
            )?,
        )
        .await?;
        let run = finished(&ns, "t").await?;
        assert_eq!(status(&run).verdict, Some(Verdict::Ok));
        gone(
            &ns.api::<ToolRun>(),
            "t",
            "the ToolRun deleted after its TTL",
        )
        .await?;
        gone(&ns.pods(), "t", "the pod garbage-collected").await?;
        gone(
            &ns.api::<ConfigMap>(),
            "t",
            "the ConfigMap garbage-collected",
        )
        .await?;
        op.stop().await
    })
    .await;
}

/// The result is recorded from the live log as soon as the runner writes it, before the
/// kubelet reports the pod finished (its generic PLEG notices the exit up to 1 s late).
/// Each program sleeps 1.5 s first, so its pod is reported running, and its log
/// followed, before it ends. Whether the kubelet notices one exit before the operator
/// records it is a race (the kubelet wins it about one time in ten), so the check is that
/// at least one of five runs is seen recorded while its pod is still Running: the
/// finished-pod path alone never gets there, since it records only after reading the pod
/// finished from the API server. Results are complete, recorded once, and the pods are
/// kept and finish by themselves.
#[tokio::test]
async fn a_result_is_recorded_from_the_live_log_before_the_pod_is_seen_finished() {
    use futures::{StreamExt, TryStreamExt};
    use kube::runtime::{WatchStreamExt, watcher};

    with_ns("op-live-log", |ns| async move {
        let op = Operator::start(test_config(&ns.name), "op-1").await?;
        let api = ns.api::<ToolRun>();
        // Watch first, so no change is missed.
        let mut changes = watcher(api.clone(), watcher::Config::default())
            .applied_objects()
            .boxed();
        let names: BTreeSet<String> = (0..5).map(|i| format!("live-{i}")).collect();
        let code = "import time\ntime.sleep(1.5)\nprint(1)";
        let mut recorded = std::collections::BTreeMap::new();
        let mut early = Vec::new();
        // One after the other: the node has room for few sandbox pods at once.
        for name in &names {
            create(&ns, &toolrun(name, "python", code, json!({}))?).await?;
            let deadline = tokio::time::Instant::now() + RUN_DEADLINE;
            let run = loop {
                let run = tokio::time::timeout_at(deadline, changes.try_next())
                    .await
                    .map_err(|_| anyhow!("{name} not recorded in time"))??
                    .ok_or_else(|| anyhow!("the watch ended"))?;
                let done = run
                    .status
                    .as_ref()
                    .is_some_and(|s| s.phase.is_some_and(Phase::is_finished));
                if done && run.name_any() == *name {
                    break run;
                }
            };
            // At once: what the API server says about the pod now.
            let pod = ns
                .pods()
                .get(name)
                .await
                .with_context(|| format!("the pod of {name}, recorded as {:?}", run.status))?;
            let s = status(&run);
            ensure!(
                s.verdict == Some(Verdict::Ok)
                    && s.stdout.as_deref() == Some("1\n")
                    && s.exit_code == Some(0)
                    && s.start_time.is_some()
                    && s.completion_time.is_some(),
                "{name}: {s:?}"
            );
            recorded.insert(name.clone(), s.completion_time.clone());
            if !toolrun_e2e::is_finished(&pod) {
                early.push(name.clone());
            }
        }
        eprintln!("recorded while the pod was still running: {early:?} of {names:?}");
        ensure!(
            !early.is_empty(),
            "every run was recorded only after its pod was reported finished: the live log is not used"
        );
        for name in &names {
            // The pod was not deleted for being "still running after the result": it
            // finishes by itself and keeps its log.
            wait_until(RUN_DEADLINE, "the pod finished by itself", || async {
                Ok(toolrun_e2e::is_finished(&ns.pods().get(name).await?))
            })
            .await?;
            let pod = ns.pods().get(name).await?;
            ensure!(pod.metadata.deletion_timestamp.is_none(), "{name}: pod deleted");
            ensure!(toolrun_e2e::phase(&pod) == "Succeeded", "{name}: {:?}", pod.status);
            // Recorded once: one Finished event, and the status did not change after.
            let finished_events = || async {
                Ok::<_, anyhow::Error>(
                    events_of(&ns, name)
                        .await?
                        .into_iter()
                        .filter(|(reason, _)| reason == "Finished")
                        .count(),
                )
            };
            wait_until(RUN_DEADLINE, "the Finished event", || async {
                Ok(finished_events().await? >= 1)
            })
            .await?;
            let n = finished_events().await?;
            ensure!(n == 1, "{name}: {n} Finished events");
            let run = api.get(name).await?;
            let s = status(&run);
            ensure!(
                s.verdict == Some(Verdict::Ok) && s.completion_time == recorded[name],
                "{name}: the status changed after it was recorded: {s:?}"
            );
        }
        op.stop().await
    })
    .await;
}

#[tokio::test]
async fn a_pod_deleted_mid_run_is_an_infra_error() {
    with_ns("op-podgone", |ns| async move {
        let op = Operator::start(test_config(&ns.name), "op-1").await?;
        create(
            &ns,
            &toolrun(
                "d",
                "python",
                "import time\ntime.sleep(120)",
                json!({"limits": {"timeoutSeconds": 300}}),
            )?,
        )
        .await?;
        wait_status(&ns, "d", "Running", |s| s.phase == Some(Phase::Running)).await?;
        ns.pods().delete("d", &DeleteParams::default()).await?;
        let run = finished(&ns, "d").await?;
        let s = status(&run);
        assert_eq!(s.verdict, Some(Verdict::InfraError), "{s:?}");
        let reason = s.reason.as_deref().unwrap_or("");
        assert!(reason.contains("while the program ran"), "{reason}");
        // Not retried: the program had started.
        gone(&ns.pods(), "d", "the deleted pod gone").await?;
        assert!(pods_of(&ns, "d").await?.is_empty(), "no second pod");
        op.stop().await
    })
    .await;
}

#[tokio::test]
async fn a_pod_lost_before_the_program_started_is_retried_once() {
    with_ns("op-retry", |ns| async move {
        let mut config = test_config(&ns.name);
        // No node has this label: pods stay pending (and the grace is long).
        config.operator.node_selector =
            [("toolrun.dev/no-such-pool".to_string(), "x".to_string())].into();
        config.controller.pending_grace = Duration::from_secs(300);
        let op = Operator::start(config, "op-1").await?;
        create(&ns, &toolrun("r", "python", "print(1)", json!({}))?).await?;
        wait_status(&ns, "r", "Pending with its pod", |s| {
            s.pod_name.as_deref() == Some("r")
        })
        .await?;
        ns.pods().delete("r", &DeleteParams::default()).await?;
        let run = wait_status(&ns, "r", "retried", |s| {
            s.conditions.iter().any(|c| c.type_ == RETRIED)
        })
        .await?;
        assert!(!status(&run).phase.is_some_and(Phase::is_finished));
        wait_status(&ns, "r", "Pending with the second pod", |s| {
            s.pod_name.as_deref() == Some("r-retry")
        })
        .await?;
        ns.pods()
            .delete("r-retry", &DeleteParams::default())
            .await?;
        let run = finished(&ns, "r").await?;
        let s = status(&run);
        assert_eq!(s.verdict, Some(Verdict::InfraError), "{s:?}");
        assert!(
            s.reason
                .as_deref()
                .unwrap_or("")
                .contains("after one retry"),
            "{s:?}"
        );
        let reasons: Vec<String> = events_of(&ns, "r")
            .await?
            .into_iter()
            .map(|e| e.0)
            .collect();
        assert_eq!(
            reasons.iter().filter(|r| *r == "Retried").count(),
            1,
            "{reasons:?}"
        );
        assert_eq!(
            reasons.iter().filter(|r| *r == "Created").count(),
            2,
            "{reasons:?}"
        );
        op.stop().await
    })
    .await;
}

#[tokio::test]
async fn leader_election_lets_one_replica_reconcile_and_hands_over() {
    with_ns("op-leader", |ns| async move {
        let mut config = test_config(&ns.name);
        let le = &mut config.controller.leader_election;
        le.enabled = true;
        le.lease_name = "toolrun-operator".into();
        le.lease_duration_seconds = 6;
        le.renew_deadline_seconds = 4;
        le.retry_period_seconds = 1;
        let a = Operator::start(config.clone(), "replica-a").await?;
        let b = Operator::start(config.clone(), "replica-b").await?;
        create(&ns, &toolrun("one", "python", "print(1)", json!({}))?).await?;
        assert_eq!(
            status(&finished(&ns, "one").await?).verdict,
            Some(Verdict::Ok)
        );
        let first: BTreeSet<String> = events_of(&ns, "one")
            .await?
            .into_iter()
            .map(|e| e.1)
            .collect();
        ensure!(
            first.len() == 1,
            "events from more than one replica: {first:?}"
        );
        let leader = first.into_iter().next().unwrap();
        let lease = ns
            .api::<k8s_openapi::api::coordination::v1::Lease>()
            .get("toolrun-operator")
            .await?;
        assert_eq!(
            lease.spec.and_then(|s| s.holder_identity).as_deref(),
            Some(leader.as_str())
        );
        // The leader stops (releasing the lease); the other takes over.
        let (rest, other) = match leader.as_str() {
            "replica-a" => {
                a.stop().await?;
                (b, "replica-b")
            }
            "replica-b" => {
                b.stop().await?;
                (a, "replica-a")
            }
            x => bail!("unexpected reporting instance {x:?}"),
        };
        create(&ns, &toolrun("two", "python", "print(2)", json!({}))?).await?;
        let run = finished(&ns, "two").await?;
        assert_eq!(status(&run).stdout.as_deref(), Some("2\n"));
        let second: BTreeSet<String> = events_of(&ns, "two")
            .await?
            .into_iter()
            .map(|e| e.1)
            .collect();
        assert_eq!(second, BTreeSet::from([other.to_string()]));
        rest.stop().await
    })
    .await;
}

/// Create -> Succeeded latency of `print(1)` over 20 sequential runs (a measurement,
/// not a check: `cargo test -p toolrun-operator --test cluster -- --ignored --nocapture`).
#[tokio::test]
#[ignore = "measurement; run explicitly"]
async fn measure_create_to_succeeded_latency() {
    with_ns("op-latency", |ns| async move {
        let op = Operator::start(test_config(&ns.name), "op-1").await?;
        let api = ns.api::<ToolRun>();
        let mut samples = Vec::new();
        for i in 0..20 {
            let name = format!("lat-{i}");
            let t0 = Instant::now();
            create(&ns, &toolrun(&name, "python", "print(1)", json!({}))?).await?;
            // Poll tightly: this measures the operator, not the poll interval.
            let (mut pod_seen, mut pod_done) = (None, None);
            loop {
                if pod_done.is_none()
                    && let Some(p) = ns.pods().get_opt(&name).await?
                {
                    pod_seen.get_or_insert(t0.elapsed());
                    if toolrun_e2e::is_finished(&p) {
                        pod_done = Some(t0.elapsed());
                    }
                }
                let run = api.get(&name).await?;
                if run.status.as_ref().is_some_and(|s| s.phase.is_some_and(Phase::is_finished)) {
                    ensure!(status(&run).verdict == Some(Verdict::Ok), "{:?}", run.status);
                    break;
                }
                ensure!(t0.elapsed() < RUN_DEADLINE, "run {name} did not finish");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            eprintln!(
                "{name}: pod created {pod_seen:?}, pod finished {pod_done:?}, recorded {:?}",
                t0.elapsed()
            );
            samples.push(t0.elapsed());
        }
        samples.sort();
        let p = |q: f64| samples[((samples.len() as f64 * q).ceil() as usize).clamp(1, samples.len()) - 1];
        eprintln!(
            "create -> Succeeded, python print(1), {} sequential runs: p50 {:?}, p99 {:?}, min {:?}, max {:?}",
            samples.len(),
            p(0.5),
            p(0.99),
            samples[0],
            samples[samples.len() - 1]
        );
        op.stop().await
    })
    .await;
}

/// `GET path` on the operator's admin port; the body.
async fn admin_get(addr: std::net::SocketAddr, path: &str) -> Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .await?;
    let mut out = String::new();
    s.read_to_string(&mut out).await?;
    Ok(out)
}

/// A free local port for the admin listener.
fn free_addr() -> std::net::SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}

#[tokio::test]
async fn a_replica_that_loses_the_lease_stops_reconciling() {
    with_ns("op-lease-lost", |ns| async move {
        let mut config = test_config(&ns.name);
        let le = &mut config.controller.leader_election;
        le.enabled = true;
        le.lease_duration_seconds = 6;
        le.renew_deadline_seconds = 4;
        le.retry_period_seconds = 1;
        let addr = free_addr();
        config.controller.metrics_listen = addr;
        let op = Operator::start(config, "replica-a").await?;
        let leader_gauge = |v: u8| {
            let want = format!("toolrun_operator_leader {v}");
            move || {
                let want = want.clone();
                async move {
                    Ok(admin_get(addr, "/metrics")
                        .await?
                        .lines()
                        .any(|l| l == want))
                }
            }
        };
        wait_until(
            Duration::from_secs(30),
            "replica-a leading",
            leader_gauge(1),
        )
        .await?;
        let ready = admin_get(addr, "/readyz").await?;
        assert!(ready.starts_with("HTTP/1.1 200"), "{ready}");
        create(&ns, &toolrun("before", "python", "print(1)", json!({}))?).await?;
        assert_eq!(
            status(&finished(&ns, "before").await?).verdict,
            Some(Verdict::Ok)
        );

        // Someone else takes the lease (as a replica that believes it won would).
        let leases = ns.api::<k8s_openapi::api::coordination::v1::Lease>();
        let now = k8s_openapi::jiff::Timestamp::now();
        leases
            .patch(
                "toolrun-operator",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {
                    "holderIdentity": "intruder",
                    "leaseDurationSeconds": 12,
                    "acquireTime": k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(now),
                    "renewTime": k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(now),
                }})),
            )
            .await?;
        wait_until(
            Duration::from_secs(30),
            "replica-a to stop leading",
            leader_gauge(0),
        )
        .await?;
        // Not leading: a new run is left alone...
        create(&ns, &toolrun("during", "python", "print(2)", json!({}))?).await?;
        let quiet = Instant::now();
        while quiet.elapsed() < Duration::from_secs(3) {
            ensure!(
                pods_of(&ns, "during").await?.is_empty(),
                "a follower created a pod"
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        ensure!(ns.api::<ToolRun>().get("during").await?.status.is_none());
        // ...until the intruder's lease expires and replica-a takes it back.
        let run = finished(&ns, "during").await?;
        assert_eq!(status(&run).stdout.as_deref(), Some("2\n"));
        op.stop().await
    })
    .await;
}

// ------------------------------------------------------------------- the in-pod agent

/// A run of `code` in bash, as the operator asks the agent for it.
fn agent_run(id: &str, code: &str) -> toolrun_runner::agent::proto::Request {
    use toolrun_runner::agent::proto::{Op, Request};
    let config = test_config("x").operator;
    let mut spec = toolrun_operator::toolrun::builders::run_spec(
        &toolrun("agent-run", "bash", code, json!({})).unwrap(),
        &config,
    )
    .unwrap();
    spec.setup = Default::default();
    Request {
        id: id.into(),
        op: Op::Run {
            spec: Box::new(spec),
        },
    }
}

#[tokio::test]
async fn the_agent_answers_over_attach_and_a_dropped_stream_loses_nothing() {
    use toolrun_operator::relay::Agent;
    use toolrun_operator::toolrun::builders::{AGENT_CONTAINER, agent_pod, network_policy};
    use toolrun_runner::agent::proto::{Body, Op, Request};
    with_ns("op-agent", |ns| async move {
        let config = test_config(&ns.name).operator;
        // The deny-all policy first: the agent refuses to run programs while the API
        // server is reachable.
        ns.api::<k8s_openapi::api::networking::v1::NetworkPolicy>()
            .create(&PostParams::default(), &network_policy(&ns.name))
            .await?;
        let pods = ns.api::<Pod>();
        let pod = agent_pod("agent-1", "bash", Default::default(), &config)?;
        pods.create(&PostParams::default(), &pod).await?;
        wait_until(RUN_DEADLINE, "the agent pod running", || async {
            Ok(pods
                .get("agent-1")
                .await?
                .status
                .and_then(|s| s.phase)
                .as_deref()
                == Some("Running"))
        })
        .await?;

        let t = Instant::now();
        let mut agent = Agent::attach(pods.clone(), "agent-1", AGENT_CONTAINER).await?;
        eprintln!("attach: {:?}", t.elapsed());
        let hello = agent
            .call(
                Request {
                    id: "hello-1".into(),
                    op: Op::Hello,
                },
                |_| {},
            )
            .await?;
        ensure!(matches!(hello.body, Body::Ok { .. }), "{hello:?}");
        // Figures for the README (printed, not asserted): a run through the agent.
        let mut times = Vec::new();
        for i in 0..10 {
            let t = Instant::now();
            agent
                .call(agent_run(&format!("warm-{i}"), "echo 1"), |_| {})
                .await?;
            times.push(t.elapsed());
        }
        times.sort();
        eprintln!(
            "run echo 1 through the agent: p50 {:?}, max {:?}",
            times[5], times[9]
        );

        // A run, its output streamed, then its record.
        let mut streamed = String::new();
        let done = agent
            .call(agent_run("run-1", "echo one; echo two >&2; exit 3"), |r| {
                if let Body::Stdout { data } = &r.body {
                    streamed.push_str(data);
                }
            })
            .await?;
        let Body::Result(record) = done.body else {
            bail!("not a result: {done:?}");
        };
        ensure!(
            record.stdout == "one\n" && record.stderr == "two\n",
            "{record:?}"
        );
        ensure!(record.exit_code == 3, "{record:?}");
        ensure!(streamed == "one\n", "streamed {streamed:?}");

        // The operator's stream drops mid-run (its process dies): a new attach sends the same
        // request again and gets every event exactly once and the one execution's record.
        let code = "for i in 1 2 3 4 5 6; do echo line-$i; sleep 0.5; done; date +%s%N";
        let mut first = Agent::attach(pods.clone(), "agent-1", AGENT_CONTAINER).await?;
        let mut before = String::new();
        let cut = tokio::time::timeout(
            Duration::from_millis(1500),
            first.call(agent_run("run-2", code), |r| {
                if let Body::Stdout { data } = &r.body {
                    before.push_str(data);
                }
            }),
        )
        .await;
        ensure!(cut.is_err(), "the run should still be going: {cut:?}");
        drop(first);
        ensure!(
            before.starts_with("line-1\n"),
            "before the drop: {before:?}"
        );
        let mut second = Agent::attach(pods.clone(), "agent-1", AGENT_CONTAINER).await?;
        let mut after = String::new();
        let done = second
            .call(agent_run("run-2", code), |r| {
                if let Body::Stdout { data } = &r.body {
                    after.push_str(data);
                }
            })
            .await?;
        let Body::Result(record) = done.body else {
            bail!("not a result: {done:?}");
        };
        let lines: Vec<&str> = record.stdout.lines().collect();
        ensure!(lines.len() == 7, "one execution: {:?}", record.stdout);
        ensure!(lines[..6] == ["line-1", "line-2", "line-3", "line-4", "line-5", "line-6"]);
        // The second client saw the whole stream once (replayed, then live).
        ensure!(
            after == record.stdout,
            "streamed {after:?} vs {:?}",
            record.stdout
        );
        // Asked again after it finished: the stored record, not a second run (same stamp).
        let again = second.call(agent_run("run-2", code), |_| {}).await?;
        let Body::Result(again) = again.body else {
            bail!("not a result: {again:?}");
        };
        ensure!(
            again.stdout == record.stdout,
            "ran twice: {:?}",
            again.stdout
        );
        second.ack(vec!["run-2".into()]).await?;

        // The stream dropped inside one client: it reattaches and finishes the call.
        second.drop_stream();
        let done = second
            .call(agent_run("run-3", "echo after-reattach"), |_| {})
            .await?;
        let Body::Result(record) = done.body else {
            bail!("not a result: {done:?}");
        };
        ensure!(record.stdout == "after-reattach\n", "{record:?}");

        // The pod gone: a typed error within the retry budget, not a hang.
        pods.delete("agent-1", &DeleteParams::default().grace_period(0))
            .await?;
        gone(&pods, "agent-1", "the agent pod deleted").await?;
        second.drop_stream();
        second.max_attempts = 2;
        let err = tokio::time::timeout(
            Duration::from_secs(30),
            second.call(agent_run("run-4", "echo x"), |_| {}),
        )
        .await
        .map_err(|_| anyhow!("no answer within 30 s for a deleted pod"))?
        .unwrap_err();
        ensure!(
            err.to_string().contains("unreachable after 2 attempts"),
            "{err}"
        );
        Ok(())
    })
    .await;
}
