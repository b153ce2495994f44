//! The Helm chart (`helm/toolrun`) from tests: find `helm`, render the chart, install a release
//! and wait until its Deployments are Available, uninstall it.
//!
//! `helm` is looked up as `$TOOLRUN_HELM`, then on `PATH` (`eval "$(tests/cluster/env)"` puts
//! it there), then in the test cluster's binary cache
//! (`${TOOLRUN_CLUSTER_CACHE:-/var/cache/toolrun/cluster}/<k8s version>/bin/helm`).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Event, Namespace, Pod};
use kube::api::{ListParams, LogParams};
use kube::{Api, Client};
use serde_json::Value;

use crate::wait_until;

/// The chart's directory in this repository.
pub fn chart_dir() -> PathBuf {
    repo_root().join("helm/toolrun")
}

/// The repository's root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Kubernetes version `helm template` renders for (the chart requires >= 1.30; helm's own
/// default without a cluster is older).
pub const KUBE_VERSION: &str = "1.34.0";

/// Components the chart deploys, by their Deployment names.
pub const DEPLOYMENTS: [&str; 2] = ["toolrun-operator", "toolrun-gateway"];

/// Where the `helm` binary is, if anywhere (see the module doc).
pub fn find_helm() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("TOOLRUN_HELM") {
        return Some(PathBuf::from(p));
    }
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            let candidate = dir.join("helm");
            if candidate.is_file() {
                return Some(candidate);
            }
        }
    }
    let cache = std::env::var_os("TOOLRUN_CLUSTER_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/cache/toolrun/cluster"));
    let mut found: Vec<PathBuf> = std::fs::read_dir(&cache)
        .ok()?
        .filter_map(|e| e.ok())
        .map(|e| e.path().join("bin/helm"))
        .filter(|p| p.is_file())
        .collect();
    found.sort();
    found.pop()
}

/// The `helm` binary.
#[derive(Debug, Clone)]
pub struct Helm {
    /// Path of the binary.
    pub path: PathBuf,
}

impl Helm {
    /// Finds `helm` (see [`find_helm`]).
    pub fn find() -> Result<Helm> {
        find_helm().map(|path| Helm { path }).ok_or_else(|| {
            anyhow!(
                "helm not found: set TOOLRUN_HELM, put it on PATH (eval \"$(tests/cluster/env)\") \
                 or build the test cluster (tests/cluster/up)"
            )
        })
    }

    /// Runs helm with `args`; returns its stdout, or fails with its stderr.
    pub async fn run<I, S>(&self, args: I) -> Result<String>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<std::ffi::OsStr>,
    {
        let args: Vec<std::ffi::OsString> =
            args.into_iter().map(|a| a.as_ref().to_owned()).collect();
        let shown = args
            .iter()
            .map(|a| a.to_string_lossy())
            .collect::<Vec<_>>()
            .join(" ");
        let out = tokio::process::Command::new(&self.path)
            .args(&args)
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output()
            .await
            .with_context(|| format!("starting {}", self.path.display()))?;
        if !out.status.success() {
            bail!(
                "`helm {shown}` failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// `helm template` of the chart as release `release` in `namespace`, with `values` given
    /// as `--set-json key=<json>`; the rendered objects.
    pub async fn template(
        &self,
        release: &str,
        namespace: &str,
        values: &[(&str, Value)],
    ) -> Result<Vec<Value>> {
        let mut args = vec![
            "template".to_string(),
            release.to_string(),
            chart_dir().display().to_string(),
            "--namespace".into(),
            namespace.into(),
            "--kube-version".into(),
            KUBE_VERSION.into(),
        ];
        args.extend(set_json(values));
        parse_manifests(&self.run(&args).await?)
    }
}

fn set_json(values: &[(&str, Value)]) -> Vec<String> {
    values
        .iter()
        .flat_map(|(k, v)| ["--set-json".to_string(), format!("{k}={v}")])
        .collect()
}

/// The objects of a multi-document YAML stream (empty documents skipped).
pub fn parse_manifests(yaml: &str) -> Result<Vec<Value>> {
    use serde::Deserialize;
    let mut objects = Vec::new();
    for doc in serde_yaml_ng::Deserializer::from_str(yaml) {
        let v = Value::deserialize(doc).context("parsing rendered YAML")?;
        if !v.is_null() {
            objects.push(v);
        }
    }
    Ok(objects)
}

/// An installed release of the chart. Uninstalled by [`Release::uninstall`], or (best effort,
/// blocking) when dropped.
pub struct Release {
    /// The helm binary it was installed with.
    pub helm: Helm,
    /// Client of the cluster it is installed in.
    pub client: Client,
    /// Release name.
    pub name: String,
    /// Release namespace (gateway and operator).
    pub namespace: String,
    /// The sandbox namespace (`sandbox.namespace`).
    pub sandbox_namespace: String,
    installed: bool,
}

/// Installs the chart as `release` into `namespace` (created if missing) and waits until its
/// Deployments are Available (see [`Release::wait_available`]). `extra_values` are passed as
/// `--set-json`; unless they set `sandbox.namespace`, the sandbox namespace is
/// `<namespace>-sbx`, so releases of parallel tests do not clash.
pub async fn install_chart(
    client: &Client,
    release: &str,
    namespace: &str,
    extra_values: &[(&str, Value)],
) -> Result<Release> {
    let release = install_only(client, release, namespace, extra_values).await?;
    if let Err(e) = release.wait_available(Duration::from_secs(180)).await {
        release.dump().await;
        return Err(e);
    }
    Ok(release)
}

/// Installs the chart like [`install_chart`] without waiting for the Deployments.
pub async fn install_only(
    client: &Client,
    release: &str,
    namespace: &str,
    extra_values: &[(&str, Value)],
) -> Result<Release> {
    let helm = Helm::find()?;
    let sandbox_namespace = extra_values
        .iter()
        .find(|(k, _)| *k == "sandbox.namespace")
        .and_then(|(_, v)| v.as_str().map(str::to_string))
        .unwrap_or_else(|| format!("{namespace}-sbx"));
    let mut args = vec![
        "install".to_string(),
        release.to_string(),
        chart_dir().display().to_string(),
        "--namespace".into(),
        namespace.into(),
        "--create-namespace".into(),
        "--set-json".into(),
        format!(
            "sandbox.namespace={}",
            Value::from(sandbox_namespace.clone())
        ),
    ];
    args.extend(set_json(extra_values));
    let mut installed = Release {
        helm: helm.clone(),
        client: client.clone(),
        name: release.to_string(),
        namespace: namespace.to_string(),
        sandbox_namespace,
        // Uninstall on drop even if install failed half-way.
        installed: true,
    };
    if let Err(e) = helm.run(&args).await {
        // Nothing to keep: a failed install leaves a failed release to clean up.
        let _ = installed.uninstall_inner().await;
        installed.installed = false;
        return Err(e);
    }
    Ok(installed)
}

/// Container states that will not become ready without a change: fail at once on them.
const HOPELESS: [&str; 6] = [
    "ErrImagePull",
    "ImagePullBackOff",
    "ErrImageNeverPull",
    "InvalidImageName",
    "CreateContainerConfigError",
    "CrashLoopBackOff",
];

impl Release {
    /// Label selector of the release's own objects.
    pub fn selector(&self) -> String {
        format!("app.kubernetes.io/instance={}", self.name)
    }

    /// Waits until every Deployment of the release is Available with all replicas updated
    /// and ready; fails at once when a pod of the release cannot start (image missing,
    /// crash loop), naming the pod, the container and the reason.
    pub async fn wait_available(&self, limit: Duration) -> Result<()> {
        let deployments: Api<Deployment> = Api::namespaced(self.client.clone(), &self.namespace);
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &self.namespace);
        let lp = ListParams::default().labels(&self.selector());
        let hopeless = std::sync::Mutex::new(None::<String>);
        wait_until(
            limit,
            "the release's Deployments to be Available",
            || async {
                for p in pods.list(&lp).await? {
                    if let Some(why) = stuck(&p) {
                        *hopeless.lock().expect("not poisoned") = Some(why);
                        return Ok(true);
                    }
                }
                for name in DEPLOYMENTS {
                    if !deployment_available(&deployments.get(name).await?) {
                        return Ok(false);
                    }
                }
                Ok(true)
            },
        )
        .await?;
        match hopeless.into_inner().expect("not poisoned") {
            Some(why) => bail!("release {} cannot become Available: {why}", self.name),
            None => Ok(()),
        }
    }

    /// `helm uninstall --wait`, then waits until the sandbox namespace is gone. The value
    /// stays usable (names, selector) to check what is left.
    pub async fn uninstall(&mut self) -> Result<()> {
        self.installed = false;
        self.uninstall_inner().await
    }

    async fn uninstall_inner(&self) -> Result<()> {
        self.helm
            .run([
                "uninstall",
                &self.name,
                "--namespace",
                &self.namespace,
                "--wait",
                "--timeout",
                "180s",
                "--ignore-not-found",
            ])
            .await?;
        let namespaces: Api<Namespace> = Api::all(self.client.clone());
        wait_until(
            Duration::from_secs(180),
            "the sandbox namespace to be deleted",
            || async { Ok(namespaces.get_opt(&self.sandbox_namespace).await?.is_none()) },
        )
        .await
    }

    /// Prints the release's pods (statuses, logs) and the events of both namespaces.
    pub async fn dump(&self) {
        eprintln!("===== diagnostics for release {} =====", self.name);
        for ns in [&self.namespace, &self.sandbox_namespace] {
            let pods: Api<Pod> = Api::namespaced(self.client.clone(), ns);
            if let Ok(list) = pods.list(&ListParams::default()).await {
                for p in list {
                    let name = p.metadata.name.clone().unwrap_or_default();
                    let st = p.status.clone().unwrap_or_default();
                    eprintln!(
                        "pod {ns}/{name}: phase={:?} containers={}",
                        st.phase,
                        serde_json::to_string(&st.container_statuses).unwrap_or_default()
                    );
                    let lp = LogParams {
                        tail_lines: Some(40),
                        ..Default::default()
                    };
                    match pods.logs(&name, &lp).await {
                        Ok(l) => eprintln!("--- log of {name} ---\n{l}--- end of log ---"),
                        Err(e) => eprintln!("(no log for {name}: {e})"),
                    }
                }
            }
            let events: Api<Event> = Api::namespaced(self.client.clone(), ns);
            if let Ok(list) = events.list(&ListParams::default()).await {
                for e in list {
                    eprintln!(
                        "event {ns} {} {}/{}: {} {}",
                        e.type_.unwrap_or_default(),
                        e.involved_object.kind.unwrap_or_default(),
                        e.involved_object.name.unwrap_or_default(),
                        e.reason.unwrap_or_default(),
                        e.message.unwrap_or_default()
                    );
                }
            }
        }
        eprintln!("===== end of diagnostics =====");
    }
}

impl Drop for Release {
    fn drop(&mut self) {
        if !self.installed {
            return;
        }
        // Best effort, from a panicking or failed test: no waiting for the namespaces.
        let _ = std::process::Command::new(&self.helm.path)
            .args([
                "uninstall",
                &self.name,
                "--namespace",
                &self.namespace,
                "--ignore-not-found",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .status();
    }
}

/// Available, every replica updated and ready, and the controller has seen the latest spec.
pub fn deployment_available(d: &Deployment) -> bool {
    let want = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    let Some(st) = d.status.as_ref() else {
        return false;
    };
    let seen = st.observed_generation >= d.metadata.generation;
    let available = st.conditions.as_ref().is_some_and(|cs| {
        cs.iter()
            .any(|c| c.type_ == "Available" && c.status == "True")
    });
    seen && available
        && st.updated_replicas.unwrap_or(0) == want
        && st.available_replicas.unwrap_or(0) == want
}

/// Why a pod cannot start, when one of its containers is in a state it will not leave alone.
pub fn stuck(p: &Pod) -> Option<String> {
    let st = p.status.as_ref()?;
    let statuses = st
        .init_container_statuses
        .iter()
        .flatten()
        .chain(st.container_statuses.iter().flatten());
    for c in statuses {
        let Some(w) = c.state.as_ref().and_then(|s| s.waiting.as_ref()) else {
            continue;
        };
        let reason = w.reason.as_deref().unwrap_or("");
        if HOPELESS.contains(&reason) {
            let last = c
                .last_state
                .as_ref()
                .and_then(|s| s.terminated.as_ref())
                .map(|t| {
                    format!(
                        " (last exit {}: {})",
                        t.exit_code,
                        t.message.as_deref().unwrap_or("")
                    )
                })
                .unwrap_or_default();
            return Some(format!(
                "pod {} container {} is {reason}: {}{last}",
                p.metadata.name.as_deref().unwrap_or("?"),
                c.name,
                w.message.as_deref().unwrap_or("")
            ));
        }
    }
    None
}
