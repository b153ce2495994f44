//! The chart release the cluster tests share (kubernetes.rs, chaos.rs): installed once per
//! test binary with `helm upgrade --install` (a later binary reuses it), and the calls the
//! tests make through its gateway.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::{DeleteParams, ListParams};
use kube::{Api, Client, ResourceExt};
use serde_json::Value;
use toolrun_crd::ToolRun;
use toolrun_e2e::*;
use toolrun_proto::v1 as pb;
use toolrun_proto::v1::tool_service_client::ToolServiceClient;

pub const RELEASE: &str = "toolrun-e2e";
pub const SYSTEM_NS: &str = "toolrun-e2e-system";
pub const SANDBOX_NS: &str = "toolrun-e2e-sandbox";

/// What the shared release offers the tests.
#[derive(Debug, Clone)]
pub struct Deployed {
    /// `http://<gateway ClusterIP>:50051`
    pub gateway: String,
    /// Gateway ClusterIP.
    pub gateway_ip: String,
    /// A gateway pod's IP.
    pub gateway_pod_ip: String,
    /// The `kubernetes` Service's ClusterIP.
    pub apiserver_ip: String,
}

/// The "public" address of the web egress test: TEST-NET-3 (RFC 5737), on the node's `lo`.
pub const WEB_PUBLIC_IP: &str = "203.0.113.10";

pub static DEPLOYED: OnceLock<Option<Result<Deployed, String>>> = OnceLock::new();

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The shared release, installed on first use. `None`: no cluster (the test is skipped,
/// unless TOOLRUN_REQUIRE_CLUSTER=1, which panics in `cluster`).
pub fn deployed(test: &str) -> Option<Deployed> {
    let test = test.to_string();
    let d = DEPLOYED.get_or_init(move || {
        // Its own runtime on its own thread: the caller is inside a test's runtime.
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async move {
                let client = cluster(&test).await?;
                Some(install(&client).await.map_err(|e| format!("{e:#}")))
            })
        })
        .join()
        .unwrap_or_else(|_| Some(Err("the install thread panicked".into())))
    });
    match d {
        None => None,
        Some(Ok(d)) => Some(d.clone()),
        Some(Err(e)) => panic!("installing the chart failed: {e}"),
    }
}

pub fn run_cmd(cmd: &mut Command) -> Result<String> {
    let out = cmd.output().with_context(|| {
        format!("running {cmd:?} (is it on PATH? eval \"$(tests/cluster/env)\")")
    })?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        bail!(
            "{cmd:?} failed ({}):\n{stdout}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(stdout)
}

pub async fn install(client: &Client) -> Result<Deployed> {
    let chart = repo().join("helm/toolrun");
    let t = Instant::now();
    let res = run_cmd(
        Command::new("helm")
            .args(["upgrade", "--install", RELEASE])
            .arg(&chart)
            .args(["--namespace", SYSTEM_NS, "--create-namespace"])
            .args(["--set", &format!("sandbox.namespace={SANDBOX_NS}")])
            // These tests are about runs and sandboxes: their clients send no API key, so
            // this release runs without authentication (`--insecure-no-auth`); helm.rs's
            // install test checks the default (authentication on, the chart's first key).
            .args(["--set", "gateway.auth.enabled=false"])
            // The sandbox image may run as a custom tool's image (image_tools_* below); no
            // other image may.
            .args([
                "--set",
                &format!("sandbox.toolImages[0]={}", sandbox_image()),
            ])
            // The web tools' egress (web_fetch_reaches_public_addresses_only_*): the chart's
            // public-only rule, a "public" test server on the node (TEST-NET-3, which the
            // rule and web_fetch treat as public) allowed without approval, and the pod
            // network exempted from web_fetch's own private-address check, so that only the
            // NetworkPolicy stands between the gateway and a pod.
            .args(["--set", "gateway.web.egress=true"])
            .args([
                "--set",
                &format!("gateway.config.web.fetch.allow={{http://{WEB_PUBLIC_IP},http://*:8080}}"),
            ])
            .args([
                "--set",
                "gateway.config.web.fetch.allow_addresses={10.244.0.0/16}",
            ])
            .args(["--wait", "--timeout", "4m"]),
    );
    if let Err(e) = res {
        let diag = run_cmd(Command::new("kubectl").args([
            "get",
            "all,events",
            "-n",
            SYSTEM_NS,
            "-o",
            "wide",
        ]))
        .unwrap_or_else(|e| format!("{e:#}"));
        bail!("{e:#}\n--- kubectl get all,events -n {SYSTEM_NS} ---\n{diag}");
    }
    eprintln!("helm install of {RELEASE}: {:?}", t.elapsed());
    // An upgrade that changed the configuration rolls the pods: `--wait` returns once the
    // new ones are ready, while the old ones still terminate (and may still be picked as
    // "the gateway pod" or answer a connection). Tests start once they are gone.
    wait_until(
        Duration::from_secs(90),
        "the release's old pods to be gone",
        || {
            let pods: Api<Pod> = Api::namespaced(client.clone(), SYSTEM_NS);
            async move {
                Ok(pods
                    .list(&ListParams::default())
                    .await?
                    .items
                    .iter()
                    .all(|p| p.metadata.deletion_timestamp.is_none()))
            }
        },
    )
    .await?;

    let services: Api<Service> = Api::namespaced(client.clone(), SYSTEM_NS);
    let gateway_svc = services
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .find(|s| {
            s.spec
                .as_ref()
                .and_then(|s| s.ports.as_ref())
                .is_some_and(|ps| ps.iter().any(|p| p.port == 50051))
        })
        .context("no Service with port 50051 in the release namespace")?;
    let gateway_ip = gateway_svc
        .spec
        .and_then(|s| s.cluster_ip)
        .context("gateway Service has no ClusterIP")?;
    let gateway_pod_ip = ready_pod_ip(client, "gateway").await?;
    let apiserver_ip = Api::<Service>::namespaced(client.clone(), "default")
        .get("kubernetes")
        .await?
        .spec
        .and_then(|s| s.cluster_ip)
        .context("kubernetes Service has no ClusterIP")?;
    let d = Deployed {
        gateway: format!("http://{gateway_ip}:50051"),
        gateway_ip,
        gateway_pod_ip,
        apiserver_ip,
    };
    // The gateway answers before any test starts.
    wait_until(
        Duration::from_secs(60),
        "the gateway to answer ListTools",
        || {
            let addr = d.gateway.clone();
            async move {
                let mut c = ToolServiceClient::connect(addr).await?;
                Ok(!c
                    .list_tools(pb::ListToolsRequest::default())
                    .await?
                    .into_inner()
                    .tools
                    .is_empty())
            }
        },
    )
    .await?;
    Ok(d)
}

/// The IP of a ready pod of the release's `component` (gateway or operator), waiting up to
/// a minute for one (operator pods may be restarting).
pub async fn ready_pod_ip(client: &Client, component: &str) -> Result<String> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), SYSTEM_NS);
    let lp = ListParams::default().labels(&format!("app.kubernetes.io/component={component}"));
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let ip = pods
            .list(&lp)
            .await?
            .items
            .into_iter()
            .filter(is_ready)
            .find_map(|p| p.status.and_then(|s| s.pod_ip));
        match ip {
            Some(ip) => return Ok(ip),
            None if Instant::now() > deadline => bail!("no ready {component} pod with an IP"),
            None => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
}

pub async fn client(d: &Deployed) -> ToolServiceClient<tonic::transport::Channel> {
    ToolServiceClient::connect(d.gateway.clone())
        .await
        .expect("connecting to the gateway")
        .max_decoding_message_size(16 << 20)
}

pub fn request(call_id: &str, args: Value) -> pb::CallToolRequest {
    pb::CallToolRequest {
        call_id: call_id.to_string(),
        tool: "run_code".into(),
        arguments_json: args.to_string(),
        timeout_ms: 0,
        session_id: String::new(),
    }
}

/// A finished run_code call: its error code (None = ok) and output.
#[derive(Debug)]
pub struct Ran {
    pub code: Option<pb::ErrorCode>,
    pub message: String,
    pub out: Value,
}

impl Ran {
    pub fn stdout(&self) -> &str {
        self.out["stdout"].as_str().unwrap_or("")
    }
    pub fn stderr(&self) -> &str {
        self.out["stderr"].as_str().unwrap_or("")
    }
    pub fn exit_code(&self) -> i64 {
        self.out["exit_code"].as_i64().unwrap_or(-1)
    }
}

pub async fn run(d: &Deployed, call_id: String, args: Value) -> Result<Ran> {
    let mut c = client(d).await;
    let r = c
        .call_tool(request(&call_id, args))
        .await
        .context("CallTool")?
        .into_inner()
        .result
        .context("no result")?;
    let out = if r.output_json.is_empty() {
        Value::Null
    } else {
        serde_json::from_str(&r.output_json)?
    };
    Ok(Ran {
        code: r
            .error
            .as_ref()
            .map(|e| pb::ErrorCode::try_from(e.code).unwrap()),
        message: r.error.map(|e| e.message).unwrap_or_default(),
        out,
    })
}

pub fn unique(prefix: &str) -> String {
    let n = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{prefix}-{:x}", n % 0xffff_ffff)
}

/// The ToolRun the gateway made for `call_id`.
/// Waits until ToolRun `name` has a finished phase (its result is recorded).
pub async fn wait_finished(runs: &Api<ToolRun>, name: &str, timeout: Duration) {
    wait_until(timeout, &format!("ToolRun {name} to finish"), || {
        let (runs, name) = (runs.clone(), name.to_string());
        async move {
            Ok(runs
                .get(&name)
                .await?
                .status
                .and_then(|s| s.phase)
                .is_some_and(|p| p.is_finished()))
        }
    })
    .await
    .unwrap();
}

pub async fn toolrun_of(client: &Client, call_id: &str) -> Result<ToolRun> {
    let runs: Api<ToolRun> = Api::namespaced(client.clone(), SANDBOX_NS);
    let lp = ListParams::default().labels(&format!("toolrun.dev/call-id={call_id}"));
    let mut items = runs.list(&lp).await?.items;
    ensure!(
        items.len() == 1,
        "{} ToolRuns for call {call_id}",
        items.len()
    );
    Ok(items.remove(0))
}

/// A new session through the gateway (nothing in it asks for approval), its id.
pub async fn create_session(c: &mut ToolServiceClient<tonic::transport::Channel>) -> String {
    tokio::time::timeout(
        Duration::from_secs(180),
        c.create_session(pb::CreateSessionRequest {
            session_id: String::new(),
            approval_mode: pb::ApprovalMode::All as i32,
            idle_timeout_seconds: 600,
        }),
    )
    .await
    .expect("CreateSession within 180 s")
    .expect("CreateSession")
    .into_inner()
    .session_id
}

/// Kills every pod of the release's `component` (operator, gateway), now, without grace:
/// the selector of those pods and the names killed.
pub async fn kill_component_pods(
    system_pods: &Api<Pod>,
    component: &str,
) -> (ListParams, Vec<String>) {
    let lp = ListParams::default().labels(&format!("app.kubernetes.io/component={component}"));
    let killed: Vec<String> = system_pods
        .list(&lp)
        .await
        .unwrap()
        .items
        .iter()
        .map(|p| p.name_any())
        .collect();
    assert!(!killed.is_empty(), "no {component} pod found");
    let now = DeleteParams {
        grace_period_seconds: Some(0),
        ..Default::default()
    };
    for p in &killed {
        system_pods.delete(p, &now).await.unwrap();
    }
    (lp, killed)
}
