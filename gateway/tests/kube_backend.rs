//! The gateway's kubernetes backend against the real API server.
//!
//! The test itself plays the operator where one is needed: it watches the ToolRuns the
//! backend creates and writes their status through the status subresource. Every test has
//! its own namespace (toolrun_e2e::run_in_namespace); without a cluster the tests skip with
//! a message, with TOOLRUN_REQUIRE_CLUSTER=1 they fail.
//!
//! The `e2e_` tests then run the real operator in process (toolrun_operator::run) and the
//! gateway's gRPC server with the kubernetes backend, called with a tonic client: real pods
//! from the images `tests/cluster/up` loads.
//!
//! Run: eval "$(tests/cluster/env)"; TOOLRUN_REQUIRE_CLUSTER=1 cargo test -p toolrun --test kube_backend

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail, ensure};
use futures::StreamExt;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use toolrun::config::{KubernetesConfig, Limits, SandboxConfig};
use toolrun::error::ErrorCode;
use toolrun::metrics::Metrics;
use toolrun::sandbox::kubernetes::{KubeMetrics, StartError, startup};
use toolrun::sandbox::{KubernetesSandbox, Sandbox, SandboxRun};
use toolrun::tool::{CallContext, TypedTool};
use toolrun::tools::run_code::{LanguageArg, RunCode, RunCodeInput, SandboxPool};
use toolrun_crd::ToolRun;
use toolrun_e2e::{TestNs, run_in_namespace, wait_until};
use toolrun_proto::v1 as pb;
use toolrun_proto::v1::tool_service_client::ToolServiceClient;
use toolrun_runner::{Language, RunSpec, Verdict};

const CRD_YAML: &str = include_str!("../../deploy/crds/toolrun.dev_toolruns.yaml");

/// Installs (server-side apply) the ToolRun CRD when the cluster lacks it, and waits until
/// it is established.
async fn ensure_crd(client: &Client) -> Result<()> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let name = "toolruns.toolrun.dev";
    if crds.get_opt(name).await?.is_none() {
        let crd: CustomResourceDefinition = serde_yaml_ng::from_str(CRD_YAML)?;
        crds.patch(
            name,
            &PatchParams::apply("toolrun-e2e").force(),
            &Patch::Apply(&crd),
        )
        .await
        .context("applying the ToolRun CRD")?;
    }
    wait_until(
        Duration::from_secs(30),
        "the ToolRun CRD established",
        || {
            let crds = crds.clone();
            async move {
                let crd = crds.get(name).await?;
                Ok(crd.status.and_then(|s| s.conditions).is_some_and(|cs| {
                    cs.iter()
                        .any(|c| c.type_ == "Established" && c.status == "True")
                }))
            }
        },
    )
    .await?;
    // Established comes before API discovery serves the resource (on a fresh cluster the
    // gateway's start-up check, which reads discovery, raced it): wait for that too.
    wait_until(
        Duration::from_secs(30),
        "the ToolRun CRD served by discovery",
        || {
            let client = client.clone();
            async move {
                Ok(
                    startup::check_crd(&client, "toolrun.dev/v1alpha1", "toolruns")
                        .await
                        .is_ok(),
                )
            }
        },
    )
    .await
}

fn kube_config(ns: &TestNs) -> KubernetesConfig {
    KubernetesConfig {
        namespace: ns.name.clone(),
        ..KubernetesConfig::default()
    }
}

async fn backend(
    ns: &TestNs,
    config: KubernetesConfig,
) -> Result<(Arc<KubernetesSandbox>, KubeMetrics)> {
    ensure_crd(&ns.client).await?;
    let metrics = KubeMetrics::default();
    let sandbox = KubernetesSandbox::with_client(ns.client.clone(), &config, metrics.clone())
        .await
        .context("starting the kubernetes backend")?;
    Ok((Arc::new(sandbox), metrics))
}

fn sandbox_run(language: Language, code: &str, timeout_ms: u64, call_id: &str) -> SandboxRun {
    let limits = Limits::default();
    SandboxRun {
        language: language.as_str().into(),
        spec: RunSpec {
            language,
            code: code.into(),
            args: Vec::new(),
            env: BTreeMap::new(),
            stdin: String::new(),
            interpreter: "/usr/bin/python3".into(),
            workdir: "/tmp".into(),
            limits: toolrun::sandbox::runner_limits(&limits, timeout_ms),
            setup: Default::default(),
        },
        limits,
        tool: "run_code".into(),
        call_id: call_id.into(),
        tenant: "team-k".into(),
        workspace: None,
        session: None,
        image: None,
    }
}

/// What the stand-in operator does with each new ToolRun.
type Behaviour = Arc<
    dyn Fn(Api<ToolRun>, ToolRun) -> futures::future::BoxFuture<'static, Result<()>> + Send + Sync,
>;

/// Plays the operator: a watch on the namespace's ToolRuns, `behaviour` once per new one.
struct StandIn {
    seen: Arc<Mutex<Vec<ToolRun>>>,
    task: JoinHandle<()>,
}

impl StandIn {
    fn start(ns: &TestNs, behaviour: Behaviour) -> StandIn {
        let api: Api<ToolRun> = ns.api();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let seen2 = seen.clone();
        let task = tokio::spawn(async move {
            let mut names = HashSet::new();
            let mut objects = std::pin::pin!(
                watcher(api.clone(), watcher::Config::default())
                    .default_backoff()
                    .applied_objects()
            );
            while let Some(tr) = objects.next().await {
                let Ok(tr) = tr else { continue };
                if !names.insert(tr.name_any()) {
                    continue;
                }
                seen2.lock().unwrap().push(tr.clone());
                let (api, b) = (api.clone(), behaviour.clone());
                tokio::spawn(async move {
                    if let Err(e) = b(api, tr).await {
                        eprintln!("stand-in operator: {e:#}");
                    }
                });
            }
        });
        StandIn { seen, task }
    }

    fn seen(&self) -> Vec<ToolRun> {
        self.seen.lock().unwrap().clone()
    }
}

impl Drop for StandIn {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn set_status(api: &Api<ToolRun>, name: &str, status: Value) -> Result<()> {
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({ "status": status })),
    )
    .await
    .with_context(|| format!("writing the status of {name}"))?;
    Ok(())
}

fn running() -> Value {
    json!({"phase": "Running", "startTime": "2026-01-01T00:00:00Z"})
}

/// Writes Running, then `finished(tr)`.
fn finish_with(finished: impl Fn(&ToolRun) -> Value + Send + Sync + 'static) -> Behaviour {
    let finished = Arc::new(finished);
    Arc::new(move |api, tr| {
        let finished = finished.clone();
        Box::pin(async move {
            let name = tr.name_any();
            set_status(&api, &name, running()).await?;
            set_status(&api, &name, finished(&tr)).await
        })
    })
}

/// Writes Running and never finishes.
fn run_forever() -> Behaviour {
    Arc::new(|api, tr| Box::pin(async move { set_status(&api, &tr.name_any(), running()).await }))
}

async fn get_run(ns: &TestNs, name: &str) -> Result<ToolRun> {
    Ok(ns.api::<ToolRun>().get(name).await?)
}

async fn only_run(ns: &TestNs) -> Result<ToolRun> {
    let list = ns.api::<ToolRun>().list(&ListParams::default()).await?;
    ensure!(
        list.items.len() == 1,
        "expected one ToolRun, found {}",
        list.items.len()
    );
    Ok(list.items.into_iter().next().unwrap())
}

async fn wait_cancelled(ns: &TestNs, name: &str) -> Result<()> {
    wait_until(Duration::from_secs(15), "spec.cancel = true", || async {
        Ok(get_run(ns, name).await?.spec.cancel)
    })
    .await
}

#[tokio::test]
async fn run_code_creates_the_expected_toolrun_and_maps_its_status() {
    run_in_namespace("kube-spec-and-result", |ns| async move {
        let (sandbox, metrics) = backend(
            &ns,
            KubernetesConfig {
                runtime_class_name: None,
                ttl_seconds_after_finished: Some(120),
                ..kube_config(&ns)
            },
        )
        .await?;
        let info = sandbox.info();
        ensure!(info.backend == "kubernetes");
        ensure!(info.mechanisms.iter().any(|m| m.detail.contains(&ns.name)));
        let _op = StandIn::start(
            &ns,
            finish_with(|_| {
                json!({"phase": "Failed", "verdict": "RUNTIME_ERROR", "exitCode": 3,
                       "stdout": "out\n", "stderr": "err\n", "stdoutTruncated": true,
                       "stderrTruncated": false, "durationMs": 42, "reason": "exit 3"})
            }),
        );
        let pool = Arc::new(SandboxPool::new(
            sandbox.clone(),
            SandboxConfig::default(),
            Arc::new(Metrics::new()),
        ));
        let limits = Limits {
            memory_mb: 300,
            max_processes: 50,
            output_limit_bytes: 4096,
            ..Limits::default()
        };
        let tool = RunCode::new(pool, limits, Duration::from_secs(30));
        let mut ctx = CallContext::with_timeout("call/ü 1", Duration::from_secs(30));
        ctx.tenant = "team-k".into();
        let input = RunCodeInput {
            language: LanguageArg::Javascript,
            code: "console.log(process.argv[2])".into(),
            args: vec!["hello".into(), "two words".into()],
            env: BTreeMap::from([("GREETING".into(), "hi".into())]),
            stdin: Some("line\n".into()),
            timeout: Some(7),
        };
        let err = tool
            .run(input, &ctx)
            .await
            .expect_err("exit 3 is a failure");
        ensure!(err.code == ErrorCode::ExecutionError, "{err:?}");
        ensure!(
            err.message.contains("exited with code 3"),
            "{}",
            err.message
        );
        let out = err.output.clone().context("the output is attached")?;
        ensure!(
            out["stdout"] == "out\n" && out["stderr"] == "err\n",
            "{out}"
        );
        ensure!(out["exit_code"] == 3 && out["duration_ms"] == 42, "{out}");
        ensure!(
            out["stdout_truncated"] == true && out["stderr_truncated"] == false,
            "{out}"
        );
        ensure!(out["timed_out"] == false, "{out}");

        let tr = only_run(&ns).await?;
        let s = &tr.spec;
        ensure!(tr.name_any().starts_with("run-"), "{}", tr.name_any());
        ensure!(tr.labels()["app.kubernetes.io/created-by"] == "toolrun-gateway");
        ensure!(tr.labels()["toolrun.dev/call-id"] == toolrun_crd::labels::label_value("call/ü 1"));
        ensure!(
            tr.labels()["toolrun.dev/tenant"] == "team-k",
            "the tenant label"
        );
        ensure!(s.tool == "run_code" && s.call_id == "call/ü 1", "{s:?}");
        ensure!(s.language == "javascript");
        ensure!(s.code == "console.log(process.argv[2])");
        ensure!(s.args == ["hello", "two words"]);
        ensure!(s.stdin == "line\n");
        ensure!(
            s.env
                == [toolrun_crd::EnvVar {
                    name: "GREETING".into(),
                    value: "hi".into()
                }],
            "{:?}",
            s.env
        );
        ensure!(s.limits.timeout_seconds == Some(7), "{:?}", s.limits);
        ensure!(s.limits.memory_mib == Some(300));
        ensure!(s.limits.processes == Some(50));
        ensure!(s.limits.output_bytes == Some(4096));
        ensure!(s.ttl_seconds_after_finished == Some(120));
        ensure!(s.runtime_class_name.is_none() && !s.cancel);
        // Finished: no waiter left, nothing in flight, and a finished run is not cancelled.
        ensure!(sandbox.waiting_calls() == 0 && metrics.inflight_runs.get() == 0);
        ensure!(!get_run(&ns, &tr.name_any()).await?.spec.cancel);

        // OK with output, through the Sandbox interface.
        let _op2 = StandIn::start(
            &ns,
            finish_with(|tr| {
                json!({"phase": "Succeeded", "verdict": "OK", "exitCode": 0,
                       "stdout": format!("{}\n", tr.spec.call_id), "stderr": "",
                       "durationMs": 5})
            }),
        );
        drop(_op);
        let rec = sandbox
            .run(
                sandbox_run(Language::Python, "print(1)", 5_000, "ok-call"),
                None,
                CancellationToken::new(),
            )
            .await?;
        ensure!(rec.verdict == Verdict::Ok && rec.exit_code == 0, "{rec:?}");
        ensure!(rec.stdout == "ok-call\n" && rec.duration_ms == 5, "{rec:?}");

        // What a ToolRun cannot hold is the caller's to fix: INVALID_ARGUMENTS naming the
        // field, and nothing is created.
        let before = ns
            .api::<ToolRun>()
            .list(&Default::default())
            .await?
            .items
            .len();
        let ctx = CallContext::with_timeout("too-much-stdin", Duration::from_secs(30));
        let input = RunCodeInput {
            language: LanguageArg::Python,
            code: "print(1)".into(),
            args: Vec::new(),
            env: BTreeMap::new(),
            stdin: Some("x".repeat(70_000)),
            timeout: Some(5),
        };
        let err = tool.run(input, &ctx).await.expect_err("stdin too large");
        ensure!(err.code == ErrorCode::InvalidArguments, "{err:?}");
        ensure!(err.message.contains("stdin"), "{}", err.message);
        let after = ns
            .api::<ToolRun>()
            .list(&Default::default())
            .await?
            .items
            .len();
        ensure!(before == after, "a ToolRun was created for a refused call");
        Ok(())
    })
    .await;
}

/// Sum of the API server's in-flight WATCH requests on toolruns (all namespaces).
async fn toolrun_watches(client: &Client) -> Result<f64> {
    let req = http::Request::get("/metrics").body(Vec::new())?;
    let text = client.request_text(req).await?;
    Ok(text
        .lines()
        .filter(|l| {
            l.starts_with("apiserver_longrunning_requests{")
                && l.contains("resource=\"toolruns\"")
                && l.contains("verb=\"WATCH\"")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum())
}

#[tokio::test]
async fn a_hundred_concurrent_runs_share_one_watch() {
    run_in_namespace("kube-hundred-runs", |ns| async move {
        const N: usize = 100;
        let (sandbox, metrics) = backend(&ns, kube_config(&ns)).await?;
        // The stand-in finishes nothing until the test has seen all N in flight at once.
        let release = Arc::new(tokio::sync::Semaphore::new(0));
        let gate = release.clone();
        let behaviour: Behaviour = Arc::new(move |api, tr| {
            let gate = gate.clone();
            Box::pin(async move {
                let name = tr.name_any();
                set_status(&api, &name, running()).await?;
                gate.acquire().await?.forget();
                set_status(
                    &api,
                    &name,
                    json!({"phase": "Succeeded", "verdict": "OK",
                    "exitCode": 0, "stdout": tr.spec.call_id, "stderr": "", "durationMs": 1}),
                )
                .await
            })
        });
        let _op = StandIn::start(&ns, behaviour);
        // Both watches (backend and stand-in) are open now.
        wait_until(Duration::from_secs(10), "the stand-in's watch", || async {
            Ok(toolrun_watches(&ns.client).await? >= 2.0)
        })
        .await?;
        let before = toolrun_watches(&ns.client).await?;
        let calls: Vec<_> = (0..N)
            .map(|i| {
                let sandbox = sandbox.clone();
                tokio::spawn(async move {
                    let run =
                        sandbox_run(Language::Python, "print(1)", 10_000, &format!("call-{i}"));
                    sandbox.run(run, None, CancellationToken::new()).await
                })
            })
            .collect();
        let peak = Arc::new(Mutex::new(before));
        wait_until(Duration::from_secs(60), "100 runs in flight", || {
            let peak = peak.clone();
            let client = ns.client.clone();
            let inflight = metrics.inflight_runs.get();
            async move {
                let now = toolrun_watches(&client).await?;
                let mut p = peak.lock().unwrap();
                *p = p.max(now);
                Ok(inflight == N as i64)
            }
        })
        .await?;
        ensure!(sandbox.waiting_calls() == N);
        release.add_permits(N);
        let now = toolrun_watches(&ns.client).await?;
        let peak_watches = peak.lock().unwrap().max(now);
        for (i, call) in calls.into_iter().enumerate() {
            let rec = call.await?.with_context(|| format!("call {i}"))?;
            ensure!(rec.verdict == Verdict::Ok, "call {i}: {rec:?}");
            // Each call got its own run's result (demultiplexed by name).
            ensure!(
                rec.stdout == format!("call-{i}"),
                "call {i} got {:?}",
                rec.stdout
            );
        }
        // A watch per call would add 100 watches; other suites running on the same
        // cluster may add a few of their own.
        eprintln!(
            "toolrun WATCH requests: {before} before, peak {peak_watches} with {N} calls in flight"
        );
        ensure!(
            peak_watches - before < 10.0,
            "watches grew from {before} to {peak_watches}"
        );
        ensure!(metrics.watch_restarts.get() == 0);
        ensure!(metrics.inflight_runs.get() == 0 && sandbox.waiting_calls() == 0);
        ensure!(_op.seen().len() == N);
        Ok(())
    })
    .await;
}

#[tokio::test]
async fn cancel_patches_spec_cancel_and_returns_promptly() {
    run_in_namespace("kube-cancel", |ns| async move {
        let (sandbox, metrics) = backend(&ns, kube_config(&ns)).await?;
        let _op = StandIn::start(&ns, run_forever());
        let cancel = CancellationToken::new();
        let call = {
            let (sandbox, cancel) = (sandbox.clone(), cancel.clone());
            tokio::spawn(async move {
                sandbox
                    .run(
                        sandbox_run(Language::Bash, "sleep 60", 30_000, "to-cancel"),
                        None,
                        cancel,
                    )
                    .await
            })
        };
        wait_until(Duration::from_secs(15), "the ToolRun running", || async {
            let list = ns.api::<ToolRun>().list(&ListParams::default()).await?;
            Ok(list.items.iter().any(|t| {
                t.status.as_ref().and_then(|s| s.phase) == Some(toolrun_crd::Phase::Running)
            }))
        })
        .await?;
        let t0 = std::time::Instant::now();
        cancel.cancel();
        let rec = call.await??;
        let took = t0.elapsed();
        ensure!(rec.verdict == Verdict::Cancelled, "{rec:?}");
        ensure!(took < Duration::from_secs(5), "cancel took {took:?}");
        let tr = only_run(&ns).await?;
        ensure!(tr.spec.cancel, "spec.cancel is not set");
        ensure!(rec.message.contains(&tr.name_any()), "{}", rec.message);
        ensure!(metrics.inflight_runs.get() == 0);

        // A call abandoned mid-run (its future dropped: client gone, executor backstop)
        // cancels its ToolRun too.
        let call = {
            let sandbox = sandbox.clone();
            tokio::spawn(async move {
                sandbox
                    .run(
                        sandbox_run(Language::Bash, "sleep 60", 30_000, "abandoned"),
                        None,
                        CancellationToken::new(),
                    )
                    .await
            })
        };
        let name = loop_until_new_run(&ns, &tr.name_any()).await?;
        call.abort();
        wait_cancelled(&ns, &name).await?;
        wait_until(
            Duration::from_secs(5),
            "in-flight gauge back to 0",
            || async { Ok(metrics.inflight_runs.get() == 0) },
        )
        .await?;
        Ok(())
    })
    .await;
}

/// Waits for a ToolRun other than `old` to appear and be Running; returns its name.
async fn loop_until_new_run(ns: &TestNs, old: &str) -> Result<String> {
    let found = Arc::new(Mutex::new(None));
    wait_until(Duration::from_secs(15), "a second ToolRun running", || {
        let found = found.clone();
        async move {
            let list = ns.api::<ToolRun>().list(&ListParams::default()).await?;
            let hit = list.items.into_iter().find(|t| {
                t.name_any() != old
                    && t.status.as_ref().and_then(|s| s.phase) == Some(toolrun_crd::Phase::Running)
            });
            let ok = hit.is_some();
            *found.lock().unwrap() = hit.map(|t| t.name_any());
            Ok(ok)
        }
    })
    .await?;
    let name = found.lock().unwrap().clone();
    name.ok_or_else(|| anyhow!("no second ToolRun"))
}

#[tokio::test]
async fn a_pod_that_never_starts_or_never_reports_is_bounded() {
    run_in_namespace("kube-start-timeout", |ns| async move {
        let (sandbox, _) = backend(
            &ns,
            KubernetesConfig {
                start_timeout_seconds: 1,
                ..kube_config(&ns)
            },
        )
        .await?;
        // No operator at all: the pod never starts.
        let t0 = std::time::Instant::now();
        let rec = sandbox
            .run(
                sandbox_run(Language::Python, "print(1)", 1_000, "never-starts"),
                None,
                CancellationToken::new(),
            )
            .await?;
        let took = t0.elapsed();
        ensure!(rec.verdict == Verdict::InfraError, "{rec:?}");
        ensure!(
            rec.message.contains("did not start within 1 s"),
            "{}",
            rec.message
        );
        ensure!(
            took >= Duration::from_secs(2) && took < Duration::from_secs(10),
            "{took:?}"
        );
        let tr = only_run(&ns).await?;
        ensure!(tr.spec.cancel, "the abandoned ToolRun is cancelled");

        // Started but never reporting: TIMEOUT, cancelled.
        let _op = StandIn::start(&ns, run_forever());
        let rec = sandbox
            .run(
                sandbox_run(Language::Python, "while True: pass", 1_000, "never-reports"),
                None,
                CancellationToken::new(),
            )
            .await?;
        ensure!(rec.verdict == Verdict::Timeout && rec.timed_out, "{rec:?}");
        ensure!(rec.message.contains("start allowance"), "{}", rec.message);
        let second = _op
            .seen()
            .into_iter()
            .find(|t| t.spec.call_id == "never-reports")
            .context("seen")?;
        wait_cancelled(&ns, &second.name_any()).await?;
        Ok(())
    })
    .await;
}

#[tokio::test]
async fn a_deleted_toolrun_is_an_infra_error() {
    run_in_namespace("kube-deleted", |ns| async move {
        let (sandbox, _) = backend(&ns, kube_config(&ns)).await?;
        let _op = StandIn::start(
            &ns,
            Arc::new(|api: Api<ToolRun>, tr: ToolRun| {
                Box::pin(async move {
                    api.delete(&tr.name_any(), &DeleteParams::default()).await?;
                    Ok(())
                }) as futures::future::BoxFuture<'static, Result<()>>
            }),
        );
        let rec = sandbox
            .run(
                sandbox_run(Language::Bash, "true", 5_000, "deleted"),
                None,
                CancellationToken::new(),
            )
            .await?;
        ensure!(rec.verdict == Verdict::InfraError, "{rec:?}");
        ensure!(
            rec.message.contains("was deleted before it finished"),
            "{}",
            rec.message
        );
        Ok(())
    })
    .await;
}

#[tokio::test]
async fn startup_names_a_missing_namespace_crd_or_permission() {
    run_in_namespace("kube-startup-errors", |ns| async move {
        ensure_crd(&ns.client).await?;
        // Namespace missing: the backend, and `toolrun serve` through it.
        let missing = format!("{}-absent", ns.name);
        let err = KubernetesSandbox::with_client(
            ns.client.clone(),
            &KubernetesConfig {
                namespace: missing.clone(),
                ..KubernetesConfig::default()
            },
            KubeMetrics::default(),
        )
        .await
        .err()
        .context("a missing namespace must fail")?;
        ensure!(
            matches!(err, StartError::NamespaceMissing(ref n) if *n == missing),
            "{err}"
        );
        let serve_err = toolrun::serve::start(toolrun::serve::ServeArgs {
            listen: "127.0.0.1:0".parse()?,
            admin_listen: "127.0.0.1:0".parse()?,
            backend: Some(toolrun::config::BackendKind::Kubernetes),
            namespace: Some(missing.clone()),
            ..toolrun::serve::ServeArgs::default()
        })
        .await
        .err()
        .context("serve must fail")?
        .to_string();
        ensure!(
            serve_err.contains("kubernetes backend")
                && serve_err.contains(&format!("namespace {missing:?} does not exist")),
            "{serve_err}"
        );

        // CRD missing: the same check on a group/version the cluster does not serve (the
        // shared CRD is not removed from under the other suites).
        let err = startup::check_crd(&ns.client, "absent.toolrun.dev/v1alpha1", "toolruns")
            .await
            .err()
            .context("an absent CRD must fail")?;
        ensure!(matches!(err, StartError::CrdMissing { .. }), "{err}");
        ensure!(
            err.to_string()
                .contains("toolruns.absent.toolrun.dev/v1alpha1"),
            "{err}"
        );
        startup::check_crd(&ns.client, "toolrun.dev/v1alpha1", "toolruns").await?;

        // RBAC: a service account with no role at all.
        let sas: Api<k8s_openapi::api::core::v1::ServiceAccount> = ns.api();
        sas.create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "nobody"}}))?,
        )
        .await?;
        let mut config = kube::Config::infer().await?;
        config.auth_info.impersonate = Some(format!("system:serviceaccount:{}:nobody", ns.name));
        let nobody = Client::try_from(config)?;
        let err = KubernetesSandbox::with_client(nobody, &kube_config(&ns), KubeMetrics::default())
            .await
            .err()
            .context("a service account without RBAC must fail")?;
        let msg = err.to_string();
        ensure!(matches!(err, StartError::Forbidden { .. }), "{msg}");
        for what in [
            "create toolruns",
            "watch toolruns",
            "patch toolruns",
            "get pods/log",
        ] {
            ensure!(msg.contains(what), "{what} not named: {msg}");
        }
        Ok(())
    })
    .await;
}

#[tokio::test]
async fn serve_with_the_kubernetes_backend_reports_it() {
    run_in_namespace("kube-serve", |ns| async move {
        ensure_crd(&ns.client).await?;
        let running = toolrun::serve::start(toolrun::serve::ServeArgs {
            listen: "127.0.0.1:0".parse()?,
            admin_listen: "127.0.0.1:0".parse()?,
            backend: Some(toolrun::config::BackendKind::Kubernetes),
            namespace: Some(ns.name.clone()),
            ..toolrun::serve::ServeArgs::default()
        })
        .await?;
        let body = reqwest_get(running.admin_addr, "/readyz").await?;
        let ready: Value = serde_json::from_str(&body)?;
        ensure!(ready["sandbox"]["backend"] == "kubernetes", "{ready}");
        let metrics = reqwest_get(running.admin_addr, "/metrics").await?;
        for name in [
            "toolrun_kube_watch_restarts_total",
            "toolrun_kube_inflight_runs",
        ] {
            ensure!(metrics.contains(name), "{name} missing from /metrics");
        }
        running.shutdown();
        running.wait().await?;
        Ok(())
    })
    .await;
}

/// GET over plain HTTP/1.1 (the admin port), without another client dependency.
async fn reqwest_get(addr: std::net::SocketAddr, path: &str) -> Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .await?;
    let mut buf = String::new();
    s.read_to_string(&mut buf).await?;
    let (head, body) = buf
        .split_once("\r\n\r\n")
        .ok_or_else(|| anyhow!("bad HTTP answer"))?;
    if !head.starts_with("HTTP/1.1 200") {
        bail!("{path}: {head}");
    }
    Ok(body.to_string())
}

// ---------------------------------------------------------------------------------------
// End to end: the real operator (in process) and the gateway's gRPC server, with a tonic
// client, against real pods.
// ---------------------------------------------------------------------------------------

type Grpc = ToolServiceClient<tonic::transport::Channel>;

/// The operator (no leader election, metrics on an ephemeral port) for `ns`, and a gateway
/// with the kubernetes backend on `ns`; both stop when the returned guard drops.
struct Stack {
    gateway: toolrun::serve::Running,
    client: Grpc,
    operator_stop: CancellationToken,
    operator: JoinHandle<()>,
}

impl Drop for Stack {
    fn drop(&mut self) {
        self.gateway.shutdown();
        self.operator_stop.cancel();
        self.operator.abort();
    }
}

async fn stack(ns: &TestNs) -> Result<Stack> {
    ensure_crd(&ns.client).await?;
    let operator_config = toolrun_operator::OperatorConfig {
        namespace: ns.name.clone(),
        ..toolrun_operator::OperatorConfig::default()
    };
    let mut ctl = toolrun_operator::ControllerConfig {
        metrics_listen: "127.0.0.1:0".parse()?,
        ..toolrun_operator::ControllerConfig::default()
    };
    ctl.leader_election.enabled = false;
    let identity = toolrun_operator::Identity {
        name: format!("e2e-{}", ns.name),
        lease_namespace: ns.name.clone(),
    };
    let operator_stop = CancellationToken::new();
    let operator = {
        let (client, stop) = (ns.client.clone(), operator_stop.clone());
        tokio::spawn(async move {
            if let Err(e) = toolrun_operator::run(
                client,
                operator_config,
                ctl,
                identity,
                stop.cancelled_owned(),
            )
            .await
            {
                eprintln!("operator: {e:#}");
            }
        })
    };
    let gateway = toolrun::serve::start(toolrun::serve::ServeArgs {
        listen: "127.0.0.1:0".parse()?,
        admin_listen: "127.0.0.1:0".parse()?,
        backend: Some(toolrun::config::BackendKind::Kubernetes),
        namespace: Some(ns.name.clone()),
        ..toolrun::serve::ServeArgs::default()
    })
    .await?;
    let client = ToolServiceClient::connect(format!("http://{}", gateway.grpc_addr)).await?;
    Ok(Stack {
        gateway,
        client,
        operator_stop,
        operator,
    })
}

fn call_req(call_id: &str, args: Value) -> pb::CallToolRequest {
    pb::CallToolRequest {
        call_id: call_id.into(),
        tool: "run_code".into(),
        arguments_json: args.to_string(),
        timeout_ms: 0,
        session_id: String::new(),
    }
}

async fn call(client: &mut Grpc, call_id: &str, args: Value) -> Result<(pb::ToolResult, Value)> {
    let t0 = std::time::Instant::now();
    let r = client
        .call_tool(call_req(call_id, args))
        .await?
        .into_inner()
        .result
        .context("a result")?;
    // Create -> pod -> result -> status -> gateway, as a caller sees it.
    eprintln!("{call_id}: answered in {:?}", t0.elapsed());
    let out = if r.output_json.is_empty() {
        Value::Null
    } else {
        serde_json::from_str(&r.output_json)?
    };
    Ok((r, out))
}

fn error_code(r: &pb::ToolResult) -> String {
    r.error
        .as_ref()
        .map(|e| toolrun::grpc::error_code_name(e.code))
        .unwrap_or_else(|| "OK".into())
}

#[tokio::test]
async fn e2e_run_code_in_three_languages_through_the_operator() {
    run_in_namespace("kube-e2e-languages", |ns| async move {
        let mut s = stack(&ns).await?;
        let client = &mut s.client;
        let (r, out) = call(client, "py-1", json!({"language": "python",
            "code": "import sys\nprint('hello', sys.argv[1])\nprint('oops', file=sys.stderr)",
            "args": ["world"]})).await?;
        ensure!(r.ok, "python: {r:?}");
        ensure!(out["stdout"] == "hello world\n" && out["stderr"] == "oops\n", "{out}");
        ensure!(out["exit_code"] == 0, "{out}");

        let (r, out) = call(client, "js-1", json!({"language": "javascript",
            "code": "console.log(require('fs').readFileSync(0, 'utf8').trim() + process.env.SUFFIX); process.exit(3)",
            "stdin": "from stdin", "env": {"SUFFIX": "!"}})).await?;
        ensure!(!r.ok && error_code(&r) == "EXECUTION_ERROR", "js: {r:?}");
        ensure!(out["stdout"] == "from stdin!\n" && out["exit_code"] == 3, "{out}");

        let (r, out) = call(client, "sh-1", json!({"language": "bash",
            "code": "echo out; echo err >&2; exit 7"})).await?;
        ensure!(error_code(&r) == "EXECUTION_ERROR", "bash: {r:?}");
        ensure!(out["stdout"] == "out\n" && out["stderr"] == "err\n" && out["exit_code"] == 7, "{out}");

        let (r, out) = call(client, "slow-1", json!({"language": "python",
            "code": "import time\nprint('started', flush=True)\ntime.sleep(60)", "timeout": 2})).await?;
        ensure!(error_code(&r) == "TIMEOUT", "timeout: {r:?}");
        ensure!(out["timed_out"] == true && out["stdout"] == "started\n", "{out}");

        // The seed's code_executor alias runs the same way.
        let mut req = call_req("exec-1", json!({"code": "print(6 * 7)"}));
        req.tool = "code_executor".into();
        let r = client.call_tool(req).await?.into_inner().result.context("a result")?;
        ensure!(r.ok, "code_executor: {r:?}");
        let out: Value = serde_json::from_str(&r.output_json)?;
        ensure!(out["stdout"] == "42\n", "{out}");

        // The ToolRuns the gateway made are what kubectl shows.
        let runs = ns.api::<ToolRun>().list(&ListParams::default()).await?;
        ensure!(runs.items.len() == 5, "{} ToolRuns", runs.items.len());
        for tr in &runs.items {
            ensure!(tr.status.as_ref().and_then(|st| st.phase).is_some_and(|p| p.is_finished()));
        }
        let tools: HashSet<(String, String)> = runs
            .items
            .iter()
            .map(|t| (t.spec.tool.clone(), t.spec.call_id.clone()))
            .collect();
        ensure!(tools.contains(&("code_executor".into(), "exec-1".into())), "{tools:?}");
        ensure!(tools.contains(&("run_code".into(), "py-1".into())), "{tools:?}");
        Ok(())
    })
    .await;
}

#[tokio::test]
async fn e2e_stream_tool_gets_live_output() {
    run_in_namespace("kube-e2e-stream", |ns| async move {
        let mut s = stack(&ns).await?;
        let mut stream = s
            .client
            .stream_tool(call_req(
                "stream-1",
                json!({"language": "bash",
                "code": "echo first; sleep 8; echo second >&2; echo third"}),
            ))
            .await?
            .into_inner();
        let t0 = std::time::Instant::now();
        let mut chunks: Vec<(std::time::Duration, String)> = Vec::new();
        let mut result = None;
        while let Some(ev) = stream.message().await? {
            match ev.event {
                Some(pb::tool_event::Event::Stdout(c)) => chunks.push((
                    t0.elapsed(),
                    format!("out:{}", String::from_utf8_lossy(&c.data)),
                )),
                Some(pb::tool_event::Event::Stderr(c)) => chunks.push((
                    t0.elapsed(),
                    format!("err:{}", String::from_utf8_lossy(&c.data)),
                )),
                Some(pb::tool_event::Event::Result(r)) => result = Some((t0.elapsed(), r)),
                Some(pb::tool_event::Event::Approval(a)) => {
                    panic!("no approval outside a session: {a:?}")
                }
                None => {}
            }
        }
        let (done_at, r) = result.context("a final result")?;
        ensure!(r.ok, "{r:?}");
        let text: String = chunks
            .iter()
            .map(|(_, c)| c.as_str())
            .collect::<Vec<_>>()
            .join("|");
        ensure!(
            text.contains("out:first") && text.contains("err:second") && text.contains("out:third"),
            "{text}"
        );
        // Live: "first" arrived while the program was still sleeping (8 s, under this
        // stack's 10 s timeout; the margin absorbs the kubelet reporting the container
        // late and a slow log request when the 2-core test node starts many pods at once).
        let first_at = chunks
            .iter()
            .find(|(_, c)| c.contains("first"))
            .map(|(t, _)| *t)
            .context("first")?;
        ensure!(
            done_at - first_at >= std::time::Duration::from_secs(3),
            "first at {first_at:?}, done at {done_at:?}"
        );
        Ok(())
    })
    .await;
}

#[tokio::test]
async fn e2e_a_client_deadline_cancels_the_toolrun() {
    run_in_namespace("kube-e2e-deadline", |ns| async move {
        let mut s = stack(&ns).await?;
        let mut req = tonic::Request::new(call_req(
            "deadline-1",
            json!({"language": "python",
            "code": "import time\nwhile True: time.sleep(1)", "timeout": 30}),
        ));
        // Long enough for the pod to start running, far shorter than the program.
        req.set_timeout(Duration::from_secs(15));
        let pods = ns.pods();
        let status = s
            .client
            .call_tool(req)
            .await
            .err()
            .context("the deadline must end the call")?;
        ensure!(
            matches!(
                status.code(),
                tonic::Code::DeadlineExceeded | tonic::Code::Cancelled
            ),
            "{status:?}"
        );
        let tr = only_run(&ns).await?;
        if let Err(e) = wait_cancelled(&ns, &tr.name_any()).await {
            let now = get_run(&ns, &tr.name_any()).await?;
            bail!("{e:#}; ToolRun now: {}", serde_json::to_string(&now)?);
        }
        wait_until(
            Duration::from_secs(60),
            "the run's pod gone or stopped",
            || async {
                Ok(match pods.get_opt(&tr.name_any()).await? {
                    None => true,
                    Some(p) => {
                        toolrun_e2e::is_finished(&p) || p.metadata.deletion_timestamp.is_some()
                    }
                })
            },
        )
        .await?;
        let tr = get_run(&ns, &tr.name_any()).await?;
        eprintln!(
            "cancelled ToolRun status: {:?}",
            tr.status.as_ref().map(|st| (st.phase, st.verdict))
        );
        Ok(())
    })
    .await;
}
