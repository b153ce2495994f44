//! Helpers for toolrun's cluster tests.
//!
//! Every test gets its own labelled namespace ([`TestNs`]), waits on conditions with
//! deadlines, and on failure prints the namespace's pods, their logs and its events before the
//! namespace is deleted. Without a reachable cluster a test prints why and returns (a skip),
//! unless `TOOLRUN_REQUIRE_CLUSTER=1`, in which case it fails.

pub mod helm;

use std::collections::BTreeMap;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, anyhow, bail};
use futures::FutureExt;
use k8s_openapi::api::core::v1::{
    Capabilities, Container, EmptyDirVolumeSource, Event, Namespace, Pod, PodSecurityContext,
    PodSpec, ResourceRequirements, SeccompProfile, SecurityContext, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{DeleteParams, ListParams, LogParams, ObjectMeta, PostParams};
use kube::runtime::wait::await_condition;
use kube::{Api, Client};

/// Label on every namespace (and pod) the cluster tests create.
pub const E2E_LABEL: &str = "toolrun.dev/e2e";

/// The sandbox image the tests run (`TOOLRUN_SANDBOX_IMAGE` overrides).
pub fn sandbox_image() -> String {
    std::env::var("TOOLRUN_SANDBOX_IMAGE")
        .unwrap_or_else(|_| format!("toolrun/sandbox:{}", env!("CARGO_PKG_VERSION")))
}

fn cluster_required() -> bool {
    std::env::var("TOOLRUN_REQUIRE_CLUSTER").is_ok_and(|v| v == "1" || v == "true")
}

/// A client for the configured cluster, or `None` (after printing a skip message) when no
/// cluster is configured or reachable. Panics instead when `TOOLRUN_REQUIRE_CLUSTER=1`.
pub async fn cluster(test: &str) -> Option<Client> {
    let has_config = std::env::var_os("KUBECONFIG").is_some()
        || std::env::var_os("KUBERNETES_SERVICE_HOST").is_some()
        || std::env::var_os("HOME")
            .map(|h| std::path::Path::new(&h).join(".kube/config").exists())
            .unwrap_or(false);
    let outcome: Result<Client> = async {
        if !has_config {
            bail!("no cluster configured (set KUBECONFIG, e.g. eval \"$(tests/cluster/env)\")");
        }
        let client = Client::try_default()
            .await
            .context("loading the kubeconfig")?;
        let v = tokio::time::timeout(Duration::from_secs(15), client.apiserver_version())
            .await
            .map_err(|_| anyhow!("the API server did not answer within 15s"))?
            .context("asking the API server for its version")?;
        eprintln!("[{test}] cluster: Kubernetes {}", v.git_version);
        Ok(client)
    }
    .await;
    match outcome {
        Ok(c) => Some(c),
        Err(e) if cluster_required() => {
            panic!("[{test}] TOOLRUN_REQUIRE_CLUSTER=1 but no usable cluster: {e:#}")
        }
        Err(e) => {
            // Written to the real stderr, past the test harness's capture, so a skip is seen.
            use std::io::Write;
            let _ = writeln!(
                std::io::stderr(),
                "SKIPPED {test}: {e:#} (set TOOLRUN_REQUIRE_CLUSTER=1 to fail instead)"
            );
            None
        }
    }
}

/// A namespace owned by one test.
pub struct TestNs {
    pub client: Client,
    pub name: String,
}

static COUNTER: AtomicU32 = AtomicU32::new(0);

impl TestNs {
    pub async fn create(client: &Client, test: &str) -> Result<TestNs> {
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH)?.subsec_nanos();
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let slug: String = test
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() {
                    c.to_ascii_lowercase()
                } else {
                    '-'
                }
            })
            .take(30)
            .collect();
        let name = format!("e2e-{}-{:x}{n}", slug.trim_matches('-'), nanos % 0xfffff);
        let ns = Namespace {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                labels: Some(BTreeMap::from([(
                    E2E_LABEL.to_string(),
                    "true".to_string(),
                )])),
                ..Default::default()
            },
            ..Default::default()
        };
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await
            .with_context(|| format!("creating namespace {name}"))?;
        // Pods need the namespace's default service account (made by the controller manager).
        let sas: Api<k8s_openapi::api::core::v1::ServiceAccount> =
            Api::namespaced(client.clone(), &name);
        wait_until(
            Duration::from_secs(60),
            "default service account",
            || async { Ok(sas.get_opt("default").await?.is_some()) },
        )
        .await?;
        Ok(TestNs {
            client: client.clone(),
            name,
        })
    }

    pub fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &self.name)
    }

    pub fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
            + Clone
            + serde::de::DeserializeOwned
            + std::fmt::Debug,
        K::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), &self.name)
    }

    /// Prints the namespace's pods (with statuses and logs) and events.
    pub async fn dump(&self) {
        eprintln!("===== diagnostics for namespace {} =====", self.name);
        match self.pods().list(&ListParams::default()).await {
            Ok(pods) => {
                for p in pods {
                    let name = p.metadata.name.clone().unwrap_or_default();
                    let st = p.status.clone().unwrap_or_default();
                    eprintln!(
                        "pod {name}: phase={:?} ip={:?} containers={}",
                        st.phase,
                        st.pod_ip,
                        serde_json::to_string(&st.container_statuses).unwrap_or_default()
                    );
                    let lp = LogParams {
                        tail_lines: Some(30),
                        ..Default::default()
                    };
                    match self.pods().logs(&name, &lp).await {
                        Ok(l) => eprintln!("--- log of {name} ---\n{l}--- end of log ---"),
                        Err(e) => eprintln!("(no log for {name}: {e})"),
                    }
                }
            }
            Err(e) => eprintln!("(listing pods failed: {e})"),
        }
        let events: Api<Event> = self.api();
        match events.list(&ListParams::default()).await {
            Ok(evs) => {
                for e in evs {
                    eprintln!(
                        "event {} {}/{}: {} {}",
                        e.type_.unwrap_or_default(),
                        e.involved_object.kind.unwrap_or_default(),
                        e.involved_object.name.unwrap_or_default(),
                        e.reason.unwrap_or_default(),
                        e.message.unwrap_or_default()
                    );
                }
            }
            Err(e) => eprintln!("(listing events failed: {e})"),
        }
        eprintln!("===== end of diagnostics =====");
    }

    pub async fn delete(&self) {
        let _ = Api::<Namespace>::all(self.client.clone())
            .delete(&self.name, &DeleteParams::background())
            .await;
    }
}

/// Runs `body` in a fresh namespace; on failure (error or panic) dumps diagnostics, then
/// deletes the namespace and fails the test. Returns without running when there is no
/// cluster (see [`cluster`]).
pub async fn run_in_namespace<F, Fut>(test: &str, body: F)
where
    F: FnOnce(TestNs) -> Fut,
    Fut: Future<Output = Result<()>>,
{
    let Some(client) = cluster(test).await else {
        return;
    };
    let ns = TestNs::create(&client, test)
        .await
        .expect("creating the test namespace");
    let handle = TestNs {
        client: client.clone(),
        name: ns.name.clone(),
    };
    let outcome = AssertUnwindSafe(body(ns)).catch_unwind().await;
    let failed = !matches!(outcome, Ok(Ok(())));
    if failed {
        handle.dump().await;
    }
    handle.delete().await;
    match outcome {
        Ok(Ok(())) => {}
        Ok(Err(e)) => panic!("[{test}] failed: {e:#}"),
        Err(p) => std::panic::resume_unwind(p),
    }
}

/// Polls `check` until it returns true, failing after `limit`.
pub async fn wait_until<F, Fut>(limit: Duration, what: &str, mut check: F) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<bool>>,
{
    let deadline = tokio::time::Instant::now() + limit;
    let mut last_err = None;
    loop {
        match check().await {
            Ok(true) => return Ok(()),
            Ok(false) => {}
            Err(e) => last_err = Some(e),
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(match last_err {
                Some(e) => e.context(format!("timed out after {limit:?} waiting for {what}")),
                None => anyhow!("timed out after {limit:?} waiting for {what}"),
            });
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Waits until the pod satisfies `cond`, returning it; fails after `limit`.
pub async fn wait_pod(
    pods: &Api<Pod>,
    name: &str,
    limit: Duration,
    what: &str,
    cond: impl Fn(&Pod) -> bool,
) -> Result<Pod> {
    let found = tokio::time::timeout(
        limit,
        await_condition(pods.clone(), name, move |p: Option<&Pod>| {
            p.is_some_and(&cond)
        }),
    )
    .await
    .map_err(|_| anyhow!("timed out after {limit:?} waiting for pod {name} to be {what}"))?
    .with_context(|| format!("watching pod {name}"))?;
    found.ok_or_else(|| anyhow!("pod {name} disappeared while waiting for it to be {what}"))
}

pub fn phase(p: &Pod) -> &str {
    p.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("")
}

pub fn is_finished(p: &Pod) -> bool {
    matches!(phase(p), "Succeeded" | "Failed")
}

pub fn is_ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// A locked-down pod running the sandbox image as uid 65534 with a read-only root and a
/// memory-backed /tmp: the way toolrun runs untrusted code.
pub fn sandbox_pod(name: &str, labels: &[(&str, &str)], command: Vec<String>) -> Pod {
    let mut l: BTreeMap<String, String> = labels
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    l.insert(E2E_LABEL.to_string(), "true".to_string());
    let qty = |s: &str| Quantity(s.to_string());
    Pod {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            labels: Some(l),
            ..Default::default()
        },
        spec: Some(PodSpec {
            restart_policy: Some("Never".into()),
            automount_service_account_token: Some(false),
            enable_service_links: Some(false),
            termination_grace_period_seconds: Some(1),
            security_context: Some(PodSecurityContext {
                run_as_non_root: Some(true),
                run_as_user: Some(65534),
                run_as_group: Some(65534),
                seccomp_profile: Some(SeccompProfile {
                    type_: "RuntimeDefault".into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            containers: vec![Container {
                name: "main".into(),
                image: Some(sandbox_image()),
                image_pull_policy: Some("IfNotPresent".into()),
                command: Some(command),
                security_context: Some(SecurityContext {
                    allow_privilege_escalation: Some(false),
                    read_only_root_filesystem: Some(true),
                    capabilities: Some(Capabilities {
                        drop: Some(vec!["ALL".into()]),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                resources: Some(ResourceRequirements {
                    limits: Some(BTreeMap::from([
                        ("cpu".into(), qty("500m")),
                        ("memory".into(), qty("128Mi")),
                    ])),
                    requests: Some(BTreeMap::from([
                        ("cpu".into(), qty("50m")),
                        ("memory".into(), qty("128Mi")),
                    ])),
                    ..Default::default()
                }),
                volume_mounts: Some(vec![VolumeMount {
                    name: "tmp".into(),
                    mount_path: "/tmp".into(),
                    ..Default::default()
                }]),
                ..Default::default()
            }],
            volumes: Some(vec![Volume {
                name: "tmp".into(),
                empty_dir: Some(EmptyDirVolumeSource {
                    medium: Some("Memory".into()),
                    size_limit: Some(qty("16Mi")),
                }),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// `python3 -c SCRIPT`, as a container command.
pub fn python(script: &str) -> Vec<String> {
    vec!["python3".into(), "-c".into(), script.into()]
}

pub async fn logs(pods: &Api<Pod>, name: &str) -> Result<String> {
    pods.logs(name, &LogParams::default())
        .await
        .with_context(|| format!("reading the log of pod {name}"))
}
