//! What toolrun needs from a Kubernetes cluster, checked against the real thing.
//!
//! Run against the local cluster: `tests/cluster/up && eval "$(tests/cluster/env)" &&
//! TOOLRUN_REQUIRE_CLUSTER=1 cargo test -p toolrun-e2e`. Without a cluster each test prints
//! a skip message and passes, unless TOOLRUN_REQUIRE_CLUSTER=1.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod, Service};
use k8s_openapi::api::networking::v1::{NetworkPolicy, NetworkPolicySpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, OwnerReference};
use kube::Api;
use kube::api::{DeleteParams, ListParams, ObjectMeta, PostParams};
use toolrun_e2e::*;

const START: Duration = Duration::from_secs(120);

#[tokio::test]
async fn node_is_ready_and_python_pod_log_is_readable() {
    run_in_namespace("node-ready-python-log", |ns| async move {
        let nodes: Api<Node> = Api::all(ns.client.clone());
        let ready = nodes.list(&ListParams::default()).await?.items.into_iter().any(|n| {
            n.status
                .and_then(|s| s.conditions)
                .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        });
        ensure!(ready, "no node is Ready");

        let pods = ns.pods();
        let script = "import sys, os; print('hello from python', sys.version_info[0], 6 * 7, 'uid', os.getuid())";
        pods.create(&PostParams::default(), &sandbox_pod("py", &[], python(script))).await?;
        let pod = wait_pod(&pods, "py", START, "finished", is_finished).await?;
        ensure!(phase(&pod) == "Succeeded", "python pod ended {}", phase(&pod));
        let log = logs(&pods, "py").await?;
        ensure!(log.contains("hello from python 3 42 uid 65534"), "unexpected log: {log:?}");
        Ok(())
    })
    .await;
}

#[tokio::test]
async fn memory_limit_kills_over_allocating_container_with_oomkilled() {
    run_in_namespace("memory-limit-oomkilled", |ns| async move {
        let pods = ns.pods();
        // 128Mi limit (see sandbox_pod); write 400 MiB so every page is really used.
        let script = "import sys; print('allocating', flush=True); b = b'x' * (400 << 20); print('survived', len(b))";
        pods.create(&PostParams::default(), &sandbox_pod("hog", &[], python(script))).await?;
        let pod = wait_pod(&pods, "hog", START, "finished", is_finished).await?;
        ensure!(phase(&pod) == "Failed", "over-allocating pod ended {}", phase(&pod));
        let term = pod
            .status
            .and_then(|s| s.container_statuses)
            .and_then(|cs| cs.into_iter().next())
            .and_then(|c| c.state)
            .and_then(|s| s.terminated)
            .context("no terminated state for the container")?;
        ensure!(
            term.reason.as_deref() == Some("OOMKilled"),
            "container terminated with reason {:?} (exit {}), expected OOMKilled",
            term.reason,
            term.exit_code
        );
        ensure!(term.exit_code == 137, "exit code {} (expected 137: SIGKILL)", term.exit_code);
        Ok(())
    })
    .await;
}

#[tokio::test]
async fn deleting_an_owner_deletes_its_pods() {
    run_in_namespace("garbage-collector", |ns| async move {
        let cms: Api<ConfigMap> = ns.api();
        let owner = cms
            .create(
                &PostParams::default(),
                &ConfigMap {
                    metadata: ObjectMeta {
                        name: Some("owner".into()),
                        ..Default::default()
                    },
                    data: Some(BTreeMap::from([("k".into(), "v".into())])),
                    ..Default::default()
                },
            )
            .await?;
        let pods = ns.pods();
        for name in ["owned-a", "owned-b"] {
            let mut pod = sandbox_pod(name, &[], python("import time; time.sleep(600)"));
            pod.metadata.owner_references = Some(vec![OwnerReference {
                api_version: "v1".into(),
                kind: "ConfigMap".into(),
                name: "owner".into(),
                uid: owner.metadata.uid.clone().context("owner has no uid")?,
                ..Default::default()
            }]);
            pods.create(&PostParams::default(), &pod).await?;
        }
        // A pod without an owner must survive: the collector deletes only what is owned.
        pods.create(
            &PostParams::default(),
            &sandbox_pod("unowned", &[], python("import time; time.sleep(600)")),
        )
        .await?;
        for name in ["owned-a", "owned-b"] {
            wait_pod(&pods, name, START, "running", |p| phase(p) == "Running").await?;
        }
        cms.delete("owner", &DeleteParams::background()).await?;
        wait_until(
            Duration::from_secs(90),
            "the owned pods to be deleted",
            || async {
                Ok(pods.get_opt("owned-a").await?.is_none()
                    && pods.get_opt("owned-b").await?.is_none())
            },
        )
        .await?;
        let unowned = pods.get_opt("unowned").await?;
        ensure!(
            unowned.is_some_and(|p| p.metadata.deletion_timestamp.is_none()),
            "the unowned pod was deleted too"
        );
        Ok(())
    })
    .await;
}

/// A client pod that connects to HOST:PORT once a second until it sees the same outcome
/// (`open` or `blocked`) three times in a row, then prints `RESULT <outcome>` and exits 0.
fn probe_pod(name: &str, host: &str, port: u16) -> Pod {
    let script = format!(
        r#"
import socket, sys, time
last, streak = None, 0
for attempt in range(40):
    try:
        socket.create_connection(("{host}", {port}), timeout=2).close()
        now = "open"
    except OSError as e:
        now = "blocked"
        print("attempt", attempt, "error:", e, flush=True)
    streak = streak + 1 if now == last else 1
    last = now
    print("attempt", attempt, now, flush=True)
    if streak == 3:
        print("RESULT", now, flush=True)
        sys.exit(0)
    time.sleep(1)
print("RESULT undecided", flush=True)
sys.exit(1)
"#
    );
    sandbox_pod(name, &[("role", "client")], python(&script))
}

async fn probe(ns: &TestNs, name: &str, host: &str, port: u16) -> Result<String> {
    let pods = ns.pods();
    pods.create(&PostParams::default(), &probe_pod(name, host, port))
        .await?;
    let pod = wait_pod(&pods, name, START, "finished", is_finished).await?;
    let log = logs(&pods, name).await?;
    ensure!(
        phase(&pod) == "Succeeded",
        "probe {name} ended {} with log {log:?}",
        phase(&pod)
    );
    match log.lines().rev().find_map(|l| l.strip_prefix("RESULT ")) {
        Some(r) => Ok(r.trim().to_string()),
        None => bail!("probe {name} printed no RESULT: {log:?}"),
    }
}

#[tokio::test]
async fn deny_all_network_policy_blocks_pod_to_pod_traffic() {
    run_in_namespace("network-policy", |ns| async move {
        let pods = ns.pods();
        let mut server = sandbox_pod(
            "server",
            &[("role", "server")],
            vec![
                "python3".into(),
                "-m".into(),
                "http.server".into(),
                "8080".into(),
                "--directory".into(),
                "/tmp".into(),
            ],
        );
        let c = &mut server.spec.as_mut().unwrap().containers[0];
        c.readiness_probe = Some(k8s_openapi::api::core::v1::Probe {
            tcp_socket: Some(k8s_openapi::api::core::v1::TCPSocketAction {
                port: k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(8080),
                ..Default::default()
            }),
            period_seconds: Some(1),
            ..Default::default()
        });
        pods.create(&PostParams::default(), &server).await?;
        let server = wait_pod(&pods, "server", START, "ready", is_ready).await?;
        let ip = server
            .status
            .and_then(|s| s.pod_ip)
            .context("server has no pod IP")?;

        // Without a policy the pods reach each other: this is what makes the next check able to fail.
        let before = probe(&ns, "client-before", &ip, 8080).await?;
        ensure!(
            before == "open",
            "without a NetworkPolicy the server should be reachable, got {before}"
        );

        let policies: Api<NetworkPolicy> = ns.api();
        let deny_all = NetworkPolicy {
            metadata: ObjectMeta {
                name: Some("deny-all".into()),
                ..Default::default()
            },
            spec: Some(NetworkPolicySpec {
                pod_selector: Some(LabelSelector {
                    match_labels: Some(BTreeMap::from([("role".into(), "server".into())])),
                    ..Default::default()
                }),
                policy_types: Some(vec!["Ingress".into(), "Egress".into()]),
                ..Default::default()
            }),
        };
        policies.create(&PostParams::default(), &deny_all).await?;
        let during = probe(&ns, "client-denied", &ip, 8080).await?;
        ensure!(
            during == "blocked",
            "with a deny-all NetworkPolicy on the server the connection should fail, got {during}"
        );

        // And the failure was the policy's doing: without it the server is reachable again.
        policies
            .delete("deny-all", &DeleteParams::default())
            .await?;
        let after = probe(&ns, "client-after", &ip, 8080).await?;
        ensure!(
            after == "open",
            "after deleting the policy the server should be reachable again, got {after}"
        );
        Ok(())
    })
    .await;
}

#[tokio::test]
async fn pod_reaches_api_server_through_kubernetes_service() {
    run_in_namespace("kubernetes-service", |ns| async move {
        let svc = Api::<Service>::namespaced(ns.client.clone(), "default")
            .get("kubernetes")
            .await?;
        let cluster_ip = svc
            .spec
            .and_then(|s| s.cluster_ip)
            .context("kubernetes service has no cluster IP")?;
        let script = r#"
import json, os, ssl, urllib.request
sa = "/var/run/secrets/kubernetes.io/serviceaccount"
host, port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ["KUBERNETES_SERVICE_PORT"]
ctx = ssl.create_default_context(cafile=sa + "/ca.crt")
req = urllib.request.Request(f"https://{host}:{port}/version",
    headers={"Authorization": "Bearer " + open(sa + "/token").read().strip()})
v = json.load(urllib.request.urlopen(req, context=ctx, timeout=10))
print("SERVICE", host, port)
print("VERSION", v["gitVersion"])
"#;
        let mut pod = sandbox_pod("api-client", &[], python(script));
        pod.spec.as_mut().unwrap().automount_service_account_token = Some(true);
        let pods = ns.pods();
        pods.create(&PostParams::default(), &pod).await?;
        let done = wait_pod(&pods, "api-client", START, "finished", is_finished).await?;
        let log = logs(&pods, "api-client").await?;
        ensure!(
            phase(&done) == "Succeeded",
            "API client pod ended {}: {log:?}",
            phase(&done)
        );
        ensure!(
            log.contains(&format!("SERVICE {cluster_ip} 443")),
            "the pod did not use the kubernetes Service ({cluster_ip}:443): {log:?}"
        );
        let server = ns.client.apiserver_version().await?;
        ensure!(
            log.contains(&format!("VERSION {}", server.git_version)),
            "the pod saw another version than {}: {log:?}",
            server.git_version
        );
        Ok(())
    })
    .await;
}

/// A deny-all egress NetworkPolicy selecting the pods labelled `role: isolated`.
async fn deny_egress_of_isolated(ns: &TestNs) -> Result<()> {
    let deny_egress = NetworkPolicy {
        metadata: ObjectMeta {
            name: Some("deny-egress".into()),
            ..Default::default()
        },
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(LabelSelector {
                match_labels: Some(BTreeMap::from([("role".into(), "isolated".into())])),
                ..Default::default()
            }),
            policy_types: Some(vec!["Egress".into()]),
            ..Default::default()
        }),
    };
    ns.api::<NetworkPolicy>()
        .create(&PostParams::default(), &deny_egress)
        .await?;
    Ok(())
}

/// A pod that tries HOST:PORT every 50 ms from the moment its program starts, for 4 s, and
/// prints when the first connection opened (`FIRST_OPEN <ms>`) or `NEVER_OPEN`, with the
/// errors it saw.
fn first_moment_pod(name: &str, labels: &[(&str, &str)], host: &str, port: u16) -> Pod {
    let script = format!(
        r#"
import socket, time
start = time.monotonic()
errors = {{}}
while time.monotonic() - start < 4:
    try:
        socket.create_connection(("{host}", {port}), timeout=0.2).close()
        print("FIRST_OPEN", int((time.monotonic() - start) * 1000), flush=True)
        break
    except OSError as e:
        errors[type(e).__name__] = errors.get(type(e).__name__, 0) + 1
    time.sleep(0.05)
else:
    print("NEVER_OPEN", flush=True)
print("ERRORS", sorted(errors.items()), flush=True)
"#
    );
    sandbox_pod(name, labels, python(&script))
}

async fn first_moment(ns: &TestNs, pod: Pod) -> Result<String> {
    let name = pod.metadata.name.clone().context("pod without a name")?;
    let pods = ns.pods();
    pods.create(&PostParams::default(), &pod).await?;
    let done = wait_pod(&pods, &name, START, "finished", is_finished).await?;
    let log = logs(&pods, &name).await?;
    ensure!(
        phase(&done) == "Succeeded",
        "{name} ended {}: {log:?}",
        phase(&done)
    );
    Ok(log)
}

#[tokio::test]
async fn a_pod_under_a_deny_all_egress_policy_reaches_nothing_from_its_first_moment() {
    // The test cluster's policy controller programs a pod's rules after the pod starts; it
    // fails closed (traffic of a pod it has not programmed is dropped), so a pod created after
    // a deny-all egress policy that selects it has no window in which it can connect. Target:
    // the API server through the `kubernetes` Service, the address every pod knows.
    run_in_namespace("first-moment", |ns| async move {
        let svc = Api::<Service>::namespaced(ns.client.clone(), "default")
            .get("kubernetes")
            .await?;
        let ip = svc
            .spec
            .and_then(|s| s.cluster_ip)
            .context("kubernetes service has no cluster IP")?;

        deny_egress_of_isolated(&ns).await?;

        // Control: a pod the policy does not select, same script, same namespace, opens the
        // connection within the 4 s (after the controller has programmed it).
        let control = first_moment(&ns, first_moment_pod("control", &[], &ip, 443)).await?;
        ensure!(
            control.contains("FIRST_OPEN"),
            "control pod without the policy never connected: {control:?}"
        );
        for attempt in 0..3 {
            let name = format!("isolated-{attempt}");
            let log = first_moment(
                &ns,
                first_moment_pod(&name, &[("role", "isolated")], &ip, 443),
            )
            .await?;
            ensure!(
                log.contains("NEVER_OPEN"),
                "{name}, selected by a deny-all egress policy, connected: {log:?}"
            );
            // Dropped, not refused: the packets went nowhere.
            ensure!(
                log.contains("TimeoutError") && !log.contains("ConnectionRefused"),
                "{name} saw other errors than timeouts: {log:?}"
            );
        }
        Ok(())
    })
    .await;
}

/// A pod that runs the sandbox image's runner with `--require-unreachable auto` on a tiny
/// spec read from stdin, and prints the runner's record.
fn runner_check_pod(name: &str, labels: &[(&str, &str)]) -> Pod {
    let spec = serde_json::json!({
        "language": "bash", "code": "echo program-ran", "interpreter": "/bin/bash",
        "limits": {"timeout_ms": 10000, "output_limit_bytes": 65536}
    });
    // After 3 s the policy controller has programmed the pod (it fails closed: before that,
    // even a pod no policy isolates reaches nothing, and a check would pass).
    let script = format!(
        "sleep 3; echo '{spec}' | /usr/local/bin/toolrun-runner --require-unreachable auto --unreachable-wait-ms 1500 --spec -"
    );
    sandbox_pod(name, labels, vec!["/bin/bash".into(), "-c".into(), script])
}

#[tokio::test]
async fn the_runner_refuses_to_run_while_the_api_server_is_reachable() {
    // The product verifies its isolation instead of assuming it: the runner connects to the
    // API server (KUBERNETES_SERVICE_HOST, set by the kubelet in every pod) before the program
    // starts. In a pod that no policy isolates it refuses with INFRA_ERROR naming the cause;
    // under a deny-all egress policy (control) the same pod runs the program.
    run_in_namespace("runner-reach-check", |ns| async move {
        deny_egress_of_isolated(&ns).await?;

        let open = first_moment(&ns, runner_check_pod("open", &[])).await?;
        ensure!(
            open.contains("\"verdict\":\"INFRA_ERROR\"")
                && open.contains("is reachable from the sandbox")
                && !open.contains("program-ran"),
            "the runner ran a program with the API server reachable: {open}"
        );
        let isolated =
            first_moment(&ns, runner_check_pod("isolated", &[("role", "isolated")])).await?;
        ensure!(
            isolated.contains("program-ran") && isolated.contains("\"verdict\":\"OK\""),
            "the isolated pod did not run the program: {isolated}"
        );
        Ok(())
    })
    .await;
}

/// A pod that starts the sandbox image's agent at once (`--require-unreachable auto`), sends
/// it one run after 6 s (the policy controller has programmed the pod by then) and a status,
/// and prints the agent's answers.
fn agent_watch_pod(name: &str, labels: &[(&str, &str)]) -> Pod {
    let spec = serde_json::json!({
        "language": "bash", "code": "echo program-ran", "interpreter": "/bin/bash",
        "limits": {"timeout_ms": 10000, "output_limit_bytes": 65536}
    });
    let run = serde_json::json!({"id": "r1", "op": "run", "spec": spec});
    let status = serde_json::json!({"id": "s1", "op": "status"});
    let script = format!(
        "(sleep 6; echo '{run}'; sleep 2; echo '{status}'; sleep 2) | timeout 12 /usr/local/bin/toolrun-runner agent --require-unreachable auto --unreachable-wait-ms 1500 --no-cleanup; true"
    );
    sandbox_pod(name, labels, vec!["/bin/bash".into(), "-c".into(), script])
}

#[tokio::test]
async fn the_agent_keeps_checking_and_refuses_runs_once_the_api_server_becomes_reachable() {
    // A long-lived agent starts before the policy controller has programmed its pod: the
    // controller fails closed, so the first check passes even in a pod that no policy
    // isolates (how a warm session pod without the sandbox label once ran programs with the
    // pod network). The agent keeps checking: once the pod is programmed open, runs end
    // INFRA_ERROR. Control: the same pod under a deny-all egress policy runs the program.
    run_in_namespace("agent-reach-watch", |ns| async move {
        deny_egress_of_isolated(&ns).await?;

        let open = first_moment(&ns, agent_watch_pod("open", &[])).await?;
        ensure!(
            open.contains("\"verdict\":\"INFRA_ERROR\"")
                && open.contains("became reachable from the sandbox")
                && open.contains("\"state\":\"reachable\"")
                && !open.contains("program-ran"),
            "the agent ran a program with the API server reachable (or the first check, not \
             the watch, refused it): {open}"
        );
        let isolated =
            first_moment(&ns, agent_watch_pod("isolated", &[("role", "isolated")])).await?;
        ensure!(
            isolated.contains("program-ran")
                && isolated.contains("\"verdict\":\"OK\"")
                && isolated.contains("\"state\":\"isolated\""),
            "the isolated pod did not run the program: {isolated}"
        );
        Ok(())
    })
    .await;
}
