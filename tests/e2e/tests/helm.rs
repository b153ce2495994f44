//! The Helm chart `helm/toolrun`.
//!
//! Offline (always run; they need only `helm`): lint, the CRD copy, the rendered objects
//! (hardened pods, Pod Security labels, least-privilege Roles, the operator's config as the
//! contract writes it) and the values schema. On the cluster: a server-side dry run, a real
//! install that waits for the Deployments and an uninstall that leaves only the CRD, two
//! releases side by side, and the NetworkPolicies of the gateway and the operator.
//!
//! Run: `eval "$(tests/cluster/env)"; TOOLRUN_REQUIRE_CLUSTER=1 cargo test -p toolrun-e2e
//! --test helm`. Without helm the offline tests skip with a message (fail with
//! TOOLRUN_REQUIRE_CLUSTER=1); without a cluster the cluster tests do.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{
    ConfigMap, Namespace, Pod, Secret, Service, ServiceAccount, TCPSocketAction,
};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};
use toolrun_e2e::helm::{self, Helm, Release, install_chart, install_only};
use toolrun_e2e::*;

const NS: &str = "toolrun-system";
const SANDBOX_NS: &str = "toolrun-sandbox";

fn cluster_required() -> bool {
    std::env::var("TOOLRUN_REQUIRE_CLUSTER").is_ok_and(|v| v == "1" || v == "true")
}

/// `helm`, or `None` after a skip message (a panic with TOOLRUN_REQUIRE_CLUSTER=1).
fn helm_or_skip(test: &str) -> Option<Helm> {
    match Helm::find() {
        Ok(h) => Some(h),
        Err(e) if cluster_required() => panic!("[{test}] TOOLRUN_REQUIRE_CLUSTER=1 but {e:#}"),
        Err(e) => {
            use std::io::Write;
            let _ = writeln!(std::io::stderr(), "SKIPPED {test}: {e:#}");
            None
        }
    }
}

async fn render(helm: &Helm, values: &[(&str, Value)]) -> Result<Vec<Value>> {
    helm.template("toolrun", NS, values).await
}

fn find<'a>(objs: &'a [Value], kind: &str, namespace: Option<&str>, name: &str) -> &'a Value {
    objs.iter()
        .find(|o| {
            o["kind"] == kind
                && o["metadata"]["name"] == name
                && o["metadata"]["namespace"].as_str() == namespace
        })
        .unwrap_or_else(|| panic!("no {kind} {namespace:?}/{name} rendered"))
}

fn operator_config(objs: &[Value]) -> Value {
    let cm = find(objs, "ConfigMap", Some(NS), "toolrun-operator");
    let text = cm["data"]["operator.yaml"]
        .as_str()
        .expect("operator.yaml in the ConfigMap");
    helm::parse_manifests(text).expect("operator.yaml is YAML")[0].clone()
}

/// (apiGroup, resource, verb) triples of a Role, with resourceNames when a rule has them.
fn grants(role: &Value) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for rule in role["rules"].as_array().expect("rules") {
        let names: Vec<&str> = rule["resourceNames"]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        for g in rule["apiGroups"].as_array().expect("apiGroups") {
            for r in rule["resources"].as_array().expect("resources") {
                for v in rule["verbs"].as_array().expect("verbs") {
                    let (g, r, v) = (
                        g.as_str().unwrap(),
                        r.as_str().unwrap(),
                        v.as_str().unwrap(),
                    );
                    assert!(
                        !g.contains('*') && !r.contains('*') && !v.contains('*'),
                        "wildcard in {role}"
                    );
                    out.insert(if names.is_empty() {
                        format!("{g}/{r}:{v}")
                    } else {
                        format!("{g}/{r}[{}]:{v}", names.join(","))
                    });
                }
            }
        }
    }
    out
}

fn triples(spec: &[(&str, &[&str], &[&str])]) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (group, resources, verbs) in spec {
        for r in *resources {
            for v in *verbs {
                out.insert(format!("{group}/{r}:{v}"));
            }
        }
    }
    out
}

/// The contract's RBAC of the operator in the sandbox namespace.
fn operator_sandbox_grants() -> BTreeSet<String> {
    triples(&[
        (
            "toolrun.dev",
            &["toolruns", "toolruns/status"],
            &["get", "list", "watch", "patch", "update", "delete"],
        ),
        (
            "",
            &["pods"],
            &["get", "list", "watch", "create", "delete", "patch"],
        ),
        ("", &["pods/log"], &["get"]),
        ("", &["pods/attach"], &["create", "get"]),
        (
            "toolrun.dev",
            &["toolsessions", "toolsessions/status"],
            &["get", "list", "watch", "patch", "delete"],
        ),
        ("", &["persistentvolumeclaims"], &["get", "create"]),
        (
            "",
            &["configmaps"],
            &["get", "list", "watch", "create", "delete", "patch"],
        ),
        ("", &["events"], &["create", "patch"]),
        ("events.k8s.io", &["events"], &["create", "patch"]),
        (
            "networking.k8s.io",
            &["networkpolicies"],
            &["get", "list", "watch", "create", "patch"],
        ),
    ])
}

/// The contract's RBAC of the gateway in the sandbox namespace.
fn gateway_sandbox_grants() -> BTreeSet<String> {
    triples(&[
        (
            "toolrun.dev",
            &["toolruns"],
            &["create", "get", "list", "watch", "patch", "delete"],
        ),
        ("", &["pods"], &["get", "list", "watch"]),
        ("", &["pods/log"], &["get"]),
        ("toolrun.dev", &["tools"], &["get", "list", "watch"]),
        ("toolrun.dev", &["tools/status"], &["patch"]),
        (
            "toolrun.dev",
            &["toolsessions"],
            &["get", "list", "watch", "create", "delete", "patch"],
        ),
    ])
}

/// The operator's Lease: get create update patch, all but create limited to its name.
fn operator_lease_grants() -> BTreeSet<String> {
    let mut g = triples(&[("coordination.k8s.io", &["leases"], &["create"])]);
    for v in ["get", "update", "patch"] {
        g.insert(format!("coordination.k8s.io/leases[toolrun-operator]:{v}"));
    }
    g
}

fn assert_hardened_pod(deployment: &Value) {
    let name = deployment["metadata"]["name"].as_str().unwrap();
    let spec = &deployment["spec"]["template"]["spec"];
    let psc = &spec["securityContext"];
    assert_eq!(psc["runAsNonRoot"], true, "{name}: pod runAsNonRoot");
    assert_eq!(psc["runAsUser"], 65534, "{name}: pod runAsUser");
    assert_eq!(psc["seccompProfile"]["type"], "RuntimeDefault", "{name}");
    assert_eq!(psc["runAsGroup"], 65534, "{name}: pod runAsGroup");
    for key in ["hostNetwork", "hostPID", "hostIPC"] {
        assert!(spec[key].is_null() || spec[key] == false, "{name}: {key}");
    }
    // The gateway's are on with sessions (the relay's ClusterIP comes from the relay
    // Service's variables, no cluster DNS needed); the operator's are off.
    let relay_env = spec["containers"][0]["env"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|e| e["name"] == "TOOLRUN_SESSION_RELAY_ADDRESS");
    if let Some(e) = relay_env {
        assert_eq!(
            e["value"],
            "http://$(TOOLRUN_OPERATOR_RELAY_SERVICE_HOST):$(TOOLRUN_OPERATOR_RELAY_SERVICE_PORT)"
        );
    }
    let links = name == "toolrun-gateway" && relay_env.is_some();
    assert_eq!(
        spec["enableServiceLinks"], links,
        "{name}: enableServiceLinks"
    );
    // Our pods talk to the API server, so the token is mounted, explicitly.
    assert_eq!(spec["automountServiceAccountToken"], true, "{name}");
    let containers = spec["containers"].as_array().unwrap();
    let init = spec["initContainers"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(!containers.is_empty());
    for c in containers.iter().chain(init.iter()) {
        let cname = c["name"].as_str().unwrap();
        let sc = &c["securityContext"];
        assert_eq!(sc["runAsNonRoot"], true, "{name}/{cname}: runAsNonRoot");
        assert_eq!(sc["runAsUser"], 65534, "{name}/{cname}: runAsUser");
        assert_eq!(sc["readOnlyRootFilesystem"], true, "{name}/{cname}");
        assert_eq!(sc["allowPrivilegeEscalation"], false, "{name}/{cname}");
        assert_eq!(sc["privileged"], false, "{name}/{cname}");
        assert_eq!(sc["capabilities"]["drop"], json!(["ALL"]), "{name}/{cname}");
        assert!(
            sc["capabilities"]["add"].is_null(),
            "{name}/{cname} adds capabilities"
        );
        assert_eq!(
            sc["seccompProfile"]["type"], "RuntimeDefault",
            "{name}/{cname}"
        );
        let res = &c["resources"];
        assert!(
            res["requests"]["cpu"].is_string(),
            "{name}/{cname}: cpu request"
        );
        assert!(
            res["requests"]["memory"].is_string(),
            "{name}/{cname}: memory request"
        );
        assert!(
            res["limits"]["memory"].is_string(),
            "{name}/{cname}: memory limit"
        );
        assert_eq!(c["imagePullPolicy"], "IfNotPresent", "{name}/{cname}");
    }
    let c = &containers[0];
    let port_name = c["livenessProbe"]["httpGet"]["port"].as_str().unwrap();
    let port = c["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == port_name)
        .unwrap_or_else(|| panic!("{name}: probe port {port_name} is not a container port"));
    assert_eq!(
        port["containerPort"], 9090,
        "{name}: probes on the admin port"
    );
    assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/healthz", "{name}");
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz", "{name}");
    assert_eq!(c["readinessProbe"]["httpGet"]["port"], port_name, "{name}");
}

#[tokio::test]
async fn lint_is_clean() {
    let Some(helm) = helm_or_skip("lint_is_clean") else {
        return;
    };
    let chart = helm::chart_dir().display().to_string();
    let out = helm
        .run([
            "lint",
            "--strict",
            &chart,
            "--kube-version",
            helm::KUBE_VERSION,
        ])
        .await
        .expect("helm lint --strict");
    assert!(out.contains("0 chart(s) failed"), "{out}");
    for bad in ["[WARNING]", "[ERROR]"] {
        assert!(!out.contains(bad), "helm lint reports {bad}: {out}");
    }
}

#[test]
fn chart_crds_are_the_generated_crds() {
    let root = helm::repo_root();
    let files = [
        "toolrun.dev_toolruns.yaml",
        "toolrun.dev_tools.yaml",
        "toolrun.dev_toolsessions.yaml",
    ];
    for file in files {
        let generated = std::fs::read(root.join("deploy/crds").join(file)).unwrap();
        let chart = std::fs::read(helm::chart_dir().join("crds").join(file)).unwrap();
        assert!(
            generated == chart,
            "helm/toolrun/crds/{file} differs from deploy/crds/{file}: cp deploy/crds/{file} \
             helm/toolrun/crds/"
        );
    }
    // Only the CRDs are in crds/ (Helm installs them once and never templates them).
    let mut entries: Vec<_> = std::fs::read_dir(helm::chart_dir().join("crds"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    entries.sort();
    assert_eq!(entries, files, "{entries:?}");
}

#[tokio::test]
async fn default_render_matches_the_contract() {
    let Some(helm) = helm_or_skip("default_render_matches_the_contract") else {
        return;
    };
    let objs = render(&helm, &[]).await.expect("helm template");

    // Exactly these objects, nothing cluster-wide but the sandbox namespace.
    let mut names: Vec<String> = objs
        .iter()
        .map(|o| {
            format!(
                "{} {}/{}",
                o["kind"].as_str().unwrap(),
                o["metadata"]["namespace"].as_str().unwrap_or("-"),
                o["metadata"]["name"].as_str().unwrap()
            )
        })
        .collect();
    names.sort();
    let expected = [
        "ConfigMap toolrun-system/toolrun-gateway",
        "ConfigMap toolrun-system/toolrun-operator",
        "Deployment toolrun-system/toolrun-gateway",
        "Deployment toolrun-system/toolrun-operator",
        "Namespace -/toolrun-sandbox",
        "NetworkPolicy toolrun-sandbox/toolrun-sandbox-deny-all",
        "NetworkPolicy toolrun-system/toolrun-gateway",
        "NetworkPolicy toolrun-system/toolrun-gateway-relay",
        "NetworkPolicy toolrun-system/toolrun-operator",
        "NetworkPolicy toolrun-system/toolrun-operator-relay",
        "Role toolrun-sandbox/toolrun-gateway",
        "Role toolrun-sandbox/toolrun-operator",
        "Role toolrun-system/toolrun-operator-leader-election",
        "RoleBinding toolrun-sandbox/toolrun-gateway",
        "RoleBinding toolrun-sandbox/toolrun-operator",
        "RoleBinding toolrun-system/toolrun-operator-leader-election",
        "Secret toolrun-system/toolrun-gateway-keys",
        "Secret toolrun-system/toolrun-session-relay",
        "Service toolrun-system/toolrun-gateway",
        "Service toolrun-system/toolrun-operator-metrics",
        "Service toolrun-system/toolrun-operator-relay",
        "ServiceAccount toolrun-system/toolrun-gateway",
        "ServiceAccount toolrun-system/toolrun-operator",
    ];
    assert_eq!(names, expected);

    // Standard labels everywhere (the deny-all policy's managed-by is added by Helm itself).
    for o in &objs {
        let l = &o["metadata"]["labels"];
        for key in [
            "app.kubernetes.io/name",
            "app.kubernetes.io/instance",
            "app.kubernetes.io/version",
            "app.kubernetes.io/component",
        ] {
            assert!(l[key].is_string(), "{key} missing on {}", o["metadata"]);
        }
        if o["metadata"]["name"] != "toolrun-sandbox-deny-all" {
            assert_eq!(
                l["app.kubernetes.io/managed-by"], "Helm",
                "{}",
                o["metadata"]
            );
        }
        assert_eq!(l["app.kubernetes.io/version"], "0.1.0");
    }

    // The sandbox namespace: Pod Security restricted, enforced, audited and warned.
    let ns = find(&objs, "Namespace", None, SANDBOX_NS);
    for mode in ["enforce", "audit", "warn"] {
        let l = &ns["metadata"]["labels"];
        assert_eq!(
            l[format!("pod-security.kubernetes.io/{mode}")],
            "restricted"
        );
        assert_eq!(
            l[format!("pod-security.kubernetes.io/{mode}-version")],
            "latest"
        );
    }
    let deny = find(
        &objs,
        "NetworkPolicy",
        Some(SANDBOX_NS),
        "toolrun-sandbox-deny-all",
    );
    assert_eq!(
        deny["spec"],
        json!({
            "podSelector": {"matchLabels": {"toolrun.dev/sandbox": "true"}},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [],
            "egress": [],
        })
    );

    // Our own pods are hardened.
    for name in ["toolrun-gateway", "toolrun-operator"] {
        assert_hardened_pod(find(&objs, "Deployment", Some(NS), name));
    }

    // RBAC: exactly the contract's verbs, no ClusterRole.
    assert_eq!(
        grants(find(&objs, "Role", Some(SANDBOX_NS), "toolrun-operator")),
        operator_sandbox_grants()
    );
    assert_eq!(
        grants(find(&objs, "Role", Some(SANDBOX_NS), "toolrun-gateway")),
        gateway_sandbox_grants()
    );
    assert_eq!(
        grants(find(
            &objs,
            "Role",
            Some(NS),
            "toolrun-operator-leader-election"
        )),
        operator_lease_grants()
    );
    for (binding, ns, sa) in [
        ("toolrun-operator", SANDBOX_NS, "toolrun-operator"),
        ("toolrun-gateway", SANDBOX_NS, "toolrun-gateway"),
        ("toolrun-operator-leader-election", NS, "toolrun-operator"),
    ] {
        let rb = find(&objs, "RoleBinding", Some(ns), binding);
        assert_eq!(
            rb["roleRef"],
            json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": binding})
        );
        assert_eq!(
            rb["subjects"],
            json!([{"kind": "ServiceAccount", "name": sa, "namespace": NS}])
        );
    }
    for sa in ["toolrun-gateway", "toolrun-operator"] {
        let sa = find(&objs, "ServiceAccount", Some(NS), sa);
        assert_eq!(sa["automountServiceAccountToken"], false);
    }

    // The gateway: the contract's arguments and Service.
    let gw = find(&objs, "Deployment", Some(NS), "toolrun-gateway");
    let c = &gw["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(c["image"], "toolrun/gateway:0.1.0");
    assert_eq!(
        c["args"],
        json!([
            "serve",
            "--backend",
            "kubernetes",
            "--namespace",
            SANDBOX_NS,
            "--listen",
            "0.0.0.0:50051",
            "--admin-listen",
            "0.0.0.0:9090",
            "--mcp-listen",
            "0.0.0.0:8080",
            "--max-open-rpcs",
            "16384",
            "--max-open-http-requests",
            "1024",
            "--max-message-bytes",
            "4194304",
            "--max-concurrent-streams",
            "1024",
            "--drain-timeout-ms",
            "10000",
            "--config",
            "/etc/toolrun/toolrun.yaml",
            "--api-keys",
            "/etc/toolrun-keys/keys.yaml"
        ])
    );
    // Authentication by default: the keys file (hashes only) of the chart's Secret is
    // mounted whole (an edited Secret reaches the pod), never the plain first key.
    let keys = find(&objs, "Secret", Some(NS), "toolrun-gateway-keys");
    let first = keys["data"]["first-key"].as_str().unwrap();
    assert!(
        !first.is_empty() && keys["data"]["keys.yaml"].is_string(),
        "{keys}"
    );
    let vol = gw["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "api-keys")
        .expect("the keys volume");
    assert_eq!(
        vol["secret"],
        json!({"secretName": "toolrun-gateway-keys", "items": [{"key": "keys.yaml", "path": "keys.yaml"}]})
    );
    let mount = c["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "api-keys")
        .expect("the keys mount");
    assert_eq!(mount["mountPath"], "/etc/toolrun-keys");
    assert!(mount.get("subPath").is_none(), "{mount}");
    // MCP accepts the Service's names (and localhost, for port-forward) as Host; no
    // browser origin.
    let gw_cm = find(&objs, "ConfigMap", Some(NS), "toolrun-gateway");
    let gw_cfg =
        &helm::parse_manifests(gw_cm["data"]["toolrun.yaml"].as_str().unwrap()).unwrap()[0];
    // The gateway's bound on runs in flight (gateway.maxRunsInFlight), and each tenant's
    // default share of the bounds (gateway.auth.tenantSharePercent).
    assert_eq!(gw_cfg["sandbox"]["max_concurrent_runs"], 16, "{gw_cfg}");
    assert_eq!(
        gw_cfg["auth"],
        json!({"tenant_share_percent": 50}),
        "{gw_cfg}"
    );
    assert_eq!(
        gw_cfg["mcp"],
        json!({
            "allowed_hosts": [
                "localhost",
                "127.0.0.1",
                "toolrun-gateway",
                format!("toolrun-gateway.{NS}"),
                format!("toolrun-gateway.{NS}.svc"),
                format!("toolrun-gateway.{NS}.svc.cluster.local"),
            ],
            "allowed_origins": [],
        })
    );
    let port_names: Vec<&str> = c["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(port_names, ["grpc", "admin", "mcp"]);
    assert_eq!(
        gw["spec"]["template"]["spec"]["serviceAccountName"],
        "toolrun-gateway"
    );
    let svc = find(&objs, "Service", Some(NS), "toolrun-gateway");
    let ports: Vec<(String, i64)> = svc["spec"]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["name"].as_str().unwrap().to_string(),
                p["port"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        ports,
        [
            ("grpc".to_string(), 50051),
            ("admin".to_string(), 9090),
            ("mcp".to_string(), 8080)
        ]
    );
    let svc = find(&objs, "Service", Some(NS), "toolrun-operator-metrics");
    assert_eq!(svc["spec"]["ports"][0]["port"], 9090);

    // The operator: config file, leader identity from the downward API.
    let op = find(&objs, "Deployment", Some(NS), "toolrun-operator");
    let c = &op["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(c["image"], "toolrun/operator:0.1.0");
    assert_eq!(
        c["args"],
        json!([
            "--config",
            "/etc/toolrun/operator.yaml",
            "--log-format",
            "json",
            "--relay-listen",
            "0.0.0.0:50052",
            "--relay-token-file",
            "/etc/toolrun-relay/token"
        ])
    );
    assert_eq!(op["spec"]["replicas"], 1);
    let env: BTreeMap<&str, &str> = c["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["name"].as_str().unwrap(),
                e["valueFrom"]["fieldRef"]["fieldPath"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        env,
        BTreeMap::from([
            ("POD_NAME", "metadata.name"),
            ("POD_NAMESPACE", "metadata.namespace")
        ])
    );
    let mount = c["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["mountPath"] == "/etc/toolrun")
        .expect("config mounted at /etc/toolrun");
    let vol = op["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == mount["name"])
        .unwrap();
    assert_eq!(vol["configMap"]["name"], "toolrun-operator");

    // operator.yaml is the contract's default configuration, key for key.
    let contract = helm::parse_manifests(
        r#"
namespace: toolrun-sandbox
runnerImage: toolrun/runner:0.1.0
imagePullPolicy: IfNotPresent
images:
  python:     {image: toolrun/sandbox:0.1.0, interpreter: /usr/bin/python3, runnerPath: /usr/local/bin/toolrun-runner}
  javascript: {image: toolrun/sandbox:0.1.0, interpreter: /usr/bin/node, runnerPath: /usr/local/bin/toolrun-runner}
  bash:       {image: toolrun/sandbox:0.1.0, interpreter: /bin/bash, runnerPath: /usr/local/bin/toolrun-runner}
languages:
  c:
    image: toolrun/sandbox:0.1.0
    runnerPath: /usr/local/bin/toolrun-runner
    extension: c
    command: 'gcc -O2 -std=c17 -Wall -o /tmp/.toolrun/prog {source} -lm && exec /tmp/.toolrun/prog "$@"'
  typescript:
    image: toolrun/sandbox:0.1.0
    runnerPath: /usr/local/bin/toolrun-runner
    extension: ts
    command: '/usr/bin/esbuild --log-level=warning --platform=node --format=cjs --outfile=/tmp/.toolrun/main.js {source} && exec /usr/bin/node /tmp/.toolrun/main.js "$@"'
artifacts: {maxFiles: 16, maxFileBytes: 524288, maxTotalBytes: 524288}
defaultTtlSecondsAfterFinished: 3600
defaultLimits: {timeoutSeconds: 30, memoryMiB: 256, cpuMillis: 250, processes: 64, outputBytes: 65536}
maxLimits:     {timeoutSeconds: 300, memoryMiB: 2048, cpuMillis: 2000, processes: 1024, outputBytes: 262144}
runtimeClassName: null
allowedRuntimeClassNames: []
nodeSelector: {}
tolerations: []
baseEnv: {PATH: /usr/local/bin:/usr/bin:/bin, HOME: /tmp, LANG: C.UTF-8, PYTHONDONTWRITEBYTECODE: "1"}
tmpSizeMiB: 64
ephemeralStorageMiB: 64
userNamespaces: false
warmPool: {python: 2}
toolImages: []
sessionWarmPool: 1
sessionWorkspaceMiB: 1024
sessionCpuRequestMillis: 50
controller:
  concurrency: 16
  apiQps: 300
  apiBurst: 600
  leaderElection:
    enabled: true
    leaseName: toolrun-operator
    leaseDurationSeconds: 15
    renewDeadlineSeconds: 10
    retryPeriodSeconds: 2
  metricsListen: 0.0.0.0:9090
"#,
    )
    .unwrap()
    .remove(0);
    assert_eq!(operator_config(&objs), contract);

    // Without a cluster to look at, egress goes to any address on the API server's ports
    // only; ingress only to the named ports.
    for (name, ingress_ports) in [
        ("toolrun-gateway", vec!["grpc", "mcp", "admin"]),
        ("toolrun-operator", vec!["metrics"]),
    ] {
        let np = find(&objs, "NetworkPolicy", Some(NS), name);
        assert_eq!(np["spec"]["policyTypes"], json!(["Ingress", "Egress"]));
        assert_eq!(
            np["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/component"],
            name.trim_start_matches("toolrun-")
        );
        let got: Vec<&str> = np["spec"]["ingress"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|r| r["ports"].as_array().unwrap().iter())
            .map(|p| p["port"].as_str().unwrap())
            .collect();
        assert_eq!(got, ingress_ports);
        assert_eq!(
            np["spec"]["egress"],
            json!([{
                "ports": [{"protocol": "TCP", "port": 443}, {"protocol": "TCP", "port": 6443}],
                "to": [{"ipBlock": {"cidr": "0.0.0.0/0"}}],
            }])
        );
    }
}

#[tokio::test]
async fn auth_values_reach_the_secret_the_config_and_the_flags() {
    let Some(helm) = helm_or_skip("auth_values_reach_the_secret_the_config_and_the_flags") else {
        return;
    };
    let args = |objs: &[Value]| {
        find(objs, "Deployment", Some(NS), "toolrun-gateway")["spec"]["template"]["spec"]
            ["containers"][0]["args"]
            .clone()
    };
    let volume = |objs: &[Value]| {
        find(objs, "Deployment", Some(NS), "toolrun-gateway")["spec"]["template"]["spec"]["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == "api-keys")
            .cloned()
    };
    let has_keys_secret = |objs: &[Value]| {
        objs.iter()
            .any(|o| o["kind"] == "Secret" && o["metadata"]["name"] == "toolrun-gateway-keys")
    };
    // A known first key: the Secret holds it and the keys file its SHA-256 (the same as
    // `toolrun keys create` writes), for the tenant named; tenants reach the config file.
    let objs = render(
        &helm,
        &[
            (
                "gateway.auth.firstKey",
                json!("trk_e2e-known-key-0123456789abcdef"),
            ),
            ("gateway.auth.firstKeyTenant", json!("team-x")),
            (
                "gateway.auth.tenants",
                json!({"slow": {"limits": {"calls_per_minute": 6}}}),
            ),
        ],
    )
    .await
    .unwrap();
    let keys = find(&objs, "Secret", Some(NS), "toolrun-gateway-keys");
    assert_eq!(
        keys["data"]["first-key"],
        "dHJrX2UyZS1rbm93bi1rZXktMDEyMzQ1Njc4OWFiY2RlZg=="
    );
    // "keys:\n- tenant: team-x\n  sha256: c69657434159f20c...e6ea\n  name: first-key\n"
    // after the comment line.
    assert_eq!(
        keys["data"]["keys.yaml"],
        "IyB0b29scnVuIEFQSSBrZXlzOiBTSEEtMjU2IGhhc2hlcyBvbmx5ICh0b29scnVuIGtleXMgY3JlYXRlIC8gcmV2b2tlKQprZXlzOgotIHRlbmFudDogdGVhbS14CiAgc2hhMjU2OiBjNjk2NTc0MzQxNTlmMjBjMzBlNzFmYmE0MjI3NjUxNzZkMGNkMjRjYjI3OTY5NjAzOTA5NmM5ZGJjODhlNmVhCiAgbmFtZTogZmlyc3Qta2V5Cg=="
    );
    let gw_cm = find(&objs, "ConfigMap", Some(NS), "toolrun-gateway");
    let gw_cfg =
        &helm::parse_manifests(gw_cm["data"]["toolrun.yaml"].as_str().unwrap()).unwrap()[0];
    assert_eq!(
        gw_cfg["auth"],
        json!({"tenants": {"slow": {"limits": {"calls_per_minute": 6}}}, "default_tenant": {},
               "tenant_share_percent": 50})
    );
    // A Secret of one's own: mounted in place of the chart's, which is not made.
    let objs = render(
        &helm,
        &[
            ("gateway.auth.existingSecret", json!("my-keys")),
            ("gateway.auth.existingSecretKey", json!("team.yaml")),
        ],
    )
    .await
    .unwrap();
    assert!(!has_keys_secret(&objs));
    assert_eq!(
        volume(&objs).unwrap()["secret"],
        json!({"secretName": "my-keys", "items": [{"key": "team.yaml", "path": "keys.yaml"}]})
    );
    assert_eq!(
        args(&objs).as_array().unwrap().last().unwrap(),
        "/etc/toolrun-keys/keys.yaml"
    );
    // Off: --insecure-no-auth (the gateway refuses a non-loopback listener without either),
    // and no Secret or volume.
    let objs = render(&helm, &[("gateway.auth.enabled", json!(false))])
        .await
        .unwrap();
    assert_eq!(
        args(&objs).as_array().unwrap().last().unwrap(),
        "--insecure-no-auth"
    );
    assert!(!has_keys_secret(&objs) && volume(&objs).is_none());
}

/// The value of `flag` in the gateway container's arguments.
fn gateway_flag(objs: &[Value], flag: &str) -> Option<String> {
    let args = find(objs, "Deployment", Some(NS), "toolrun-gateway")["spec"]["template"]["spec"]
        ["containers"][0]["args"]
        .as_array()
        .unwrap()
        .clone();
    let i = args.iter().position(|a| a == flag)?;
    Some(args.get(i + 1)?.as_str().unwrap().to_string())
}

#[tokio::test]
async fn bound_values_reach_the_gateways_flags_and_config() {
    let Some(helm) = helm_or_skip("bound_values_reach_the_gateways_flags_and_config") else {
        return;
    };
    // Every bound flag of `toolrun serve` has its value, rendered as the flag.
    let objs = render(
        &helm,
        &[
            ("gateway.maxOpenRpcs", json!(20000)),
            ("gateway.maxOpenHttpRequests", json!(64)),
            ("gateway.maxMessageBytes", json!(1048576)),
            ("gateway.maxConcurrentStreams", json!(200)),
            ("gateway.drainTimeoutMs", json!(5000)),
            ("gateway.auth.tenantSharePercent", json!(25)),
            (
                "gateway.auth.tenants",
                json!({"big": {"limits": {"open_rpcs": 20000}}}),
            ),
        ],
    )
    .await
    .unwrap();
    for (flag, value) in [
        ("--max-open-rpcs", "20000"),
        ("--max-open-http-requests", "64"),
        ("--max-message-bytes", "1048576"),
        ("--max-concurrent-streams", "200"),
        ("--drain-timeout-ms", "5000"),
    ] {
        assert_eq!(gateway_flag(&objs, flag).as_deref(), Some(value), "{flag}");
    }
    let cfg = gateway_config(&objs);
    assert_eq!(cfg["auth"]["tenant_share_percent"], 25, "{cfg}");
    assert_eq!(cfg["auth"]["tenants"]["big"]["limits"]["open_rpcs"], 20000);
    // Large values stay integers (no 2e+06 in the arguments).
    let objs = render(&helm, &[("gateway.maxOpenRpcs", json!(1000000))])
        .await
        .unwrap();
    assert_eq!(
        gateway_flag(&objs, "--max-open-rpcs").as_deref(),
        Some("1000000")
    );
    // Control: without authentication there are no tenants, hence no shares in the config.
    let objs = render(&helm, &[("gateway.auth.enabled", json!(false))])
        .await
        .unwrap();
    assert!(gateway_config(&objs).get("auth").is_none());
    assert_eq!(
        gateway_flag(&objs, "--max-open-rpcs").as_deref(),
        Some("16384")
    );
}

#[tokio::test]
async fn tls_values_mount_the_secrets_and_pass_the_flags() {
    let Some(helm) = helm_or_skip("tls_values_mount_the_secrets_and_pass_the_flags") else {
        return;
    };
    let pod = |objs: &[Value]| {
        find(objs, "Deployment", Some(NS), "toolrun-gateway")["spec"]["template"]["spec"].clone()
    };
    let args = |objs: &[Value]| -> Vec<String> {
        pod(objs)["containers"][0]["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap().to_string())
            .collect()
    };
    let named = |list: &Value, name: &str| {
        list.as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == name)
            .cloned()
    };
    let flag = |args: &[String], f: &str| {
        args.iter()
            .position(|a| a == f)
            .map(|i| args[i + 1].clone())
    };
    // Default: no TLS at all (no flags, no volumes).
    let objs = render(&helm, &[]).await.unwrap();
    let a = args(&objs);
    assert!(!a.iter().any(|a| a.starts_with("--tls")), "{a:?}");
    assert!(named(&pod(&objs)["volumes"], "tls").is_none());

    // Server TLS: the kubernetes.io/tls Secret mounted whole and read-only, the flags on it.
    let objs = render(&helm, &[("gateway.tls.secretName", json!("gw-tls"))])
        .await
        .unwrap();
    let a = args(&objs);
    assert_eq!(
        flag(&a, "--tls-cert").as_deref(),
        Some("/etc/toolrun-tls/tls.crt")
    );
    assert_eq!(
        flag(&a, "--tls-key").as_deref(),
        Some("/etc/toolrun-tls/tls.key")
    );
    assert!(flag(&a, "--tls-client-ca").is_none(), "{a:?}");
    assert!(a.contains(&"--api-keys".to_string()), "keys stay on: {a:?}");
    let p = pod(&objs);
    assert_eq!(
        named(&p["volumes"], "tls").unwrap()["secret"],
        json!({"secretName": "gw-tls", "items": [
            {"key": "tls.crt", "path": "tls.crt"}, {"key": "tls.key", "path": "tls.key"}]})
    );
    let mount = named(&p["containers"][0]["volumeMounts"], "tls").unwrap();
    assert_eq!(
        mount,
        json!({"name": "tls", "mountPath": "/etc/toolrun-tls", "readOnly": true})
    );
    assert!(
        mount.get("subPath").is_none(),
        "a subPath mount never updates"
    );

    // Mutual TLS, required, without API keys: certificates authenticate (no
    // --insecure-no-auth), and the tenants' client_certs reach the config.
    let objs = render(
        &helm,
        &[
            ("gateway.tls.secretName", json!("gw-tls")),
            ("gateway.tls.clientCASecretName", json!("agents-ca")),
            ("gateway.auth.enabled", json!(false)),
            (
                "gateway.auth.tenants",
                json!({"agents": {"client_certs": ["spiffe://cluster.local/ns/a/sa/b"]}}),
            ),
        ],
    )
    .await
    .unwrap();
    let a = args(&objs);
    assert_eq!(
        flag(&a, "--tls-client-ca").as_deref(),
        Some("/etc/toolrun-client-ca/ca.crt")
    );
    assert_eq!(flag(&a, "--tls-client-auth").as_deref(), Some("required"));
    assert!(
        !a.contains(&"--insecure-no-auth".to_string()) && !a.contains(&"--api-keys".to_string()),
        "{a:?}"
    );
    let p = pod(&objs);
    assert_eq!(
        named(&p["volumes"], "tls-client-ca").unwrap()["secret"],
        json!({"secretName": "agents-ca", "items": [{"key": "ca.crt", "path": "ca.crt"}]})
    );
    assert_eq!(
        named(&p["containers"][0]["volumeMounts"], "tls-client-ca").unwrap()["readOnly"],
        true
    );
    let gw_cm = find(&objs, "ConfigMap", Some(NS), "toolrun-gateway");
    let gw_cfg =
        &helm::parse_manifests(gw_cm["data"]["toolrun.yaml"].as_str().unwrap()).unwrap()[0];
    assert_eq!(
        gw_cfg["auth"]["tenants"]["agents"]["client_certs"],
        json!(["spiffe://cluster.local/ns/a/sa/b"])
    );

    // Optional client certificates without keys would let nobody else in: the chart keeps
    // the rule that no authentication at all needs --insecure-no-auth; its own CA key name.
    let objs = render(
        &helm,
        &[
            ("gateway.tls.secretName", json!("gw-tls")),
            ("gateway.tls.clientCASecretName", json!("agents-ca")),
            ("gateway.tls.clientCAKey", json!("bundle.pem")),
            ("gateway.tls.clientAuth", json!("optional")),
        ],
    )
    .await
    .unwrap();
    let a = args(&objs);
    assert_eq!(flag(&a, "--tls-client-auth").as_deref(), Some("optional"));
    assert!(a.contains(&"--api-keys".to_string()), "{a:?}");
    assert_eq!(
        named(&pod(&objs)["volumes"], "tls-client-ca").unwrap()["secret"]["items"],
        json!([{"key": "bundle.pem", "path": "ca.crt"}])
    );
}

#[tokio::test]
async fn values_reach_the_operator_config_and_the_pods() {
    let Some(helm) = helm_or_skip("values_reach_the_operator_config_and_the_pods") else {
        return;
    };
    let objs = render(
        &helm,
        &[
            ("sandbox.namespace", json!("agents-sandbox")),
            ("images.sandbox.tag", json!("9.9.9")),
            ("images.gateway.repository", json!("registry.example/toolrun-gateway")),
            ("languages.python.image", json!("python:3.13-slim")),
            ("languages.python.interpreter", json!("/usr/local/bin/python3")),
            ("languages.javascript.image", json!("registry.example/node-with-runner:1")),
            ("languages.javascript.runnerPath", json!("/opt/toolrun-runner")),
            ("sandbox.runtimeClassName", json!("gvisor")),
            ("sandbox.allowedRuntimeClassNames", json!(["kata"])),
            ("sandbox.nodeSelector", json!({"toolrun.dev/pool": "sandbox"})),
            (
                "sandbox.tolerations",
                json!([{"key": "toolrun.dev/sandbox", "operator": "Exists", "effect": "NoSchedule"}]),
            ),
            ("sandbox.defaultLimits.timeoutSeconds", json!(10)),
            ("sandbox.maxLimits.memoryMiB", json!(4096)),
            ("sandbox.ttlSecondsAfterFinished", json!(60)),
            ("operator.replicas", json!(2)),
            ("operator.controller.concurrency", json!(4)),
            ("operator.podAnnotations", json!({"prometheus.io/scrape": "true"})),
            ("gateway.replicas", json!(3)),
            ("gateway.config", json!({"tools": {"calculator": {"enabled": false}}})),
            ("gateway.mcp.port", json!(8181)),
            ("gateway.mcp.extraAllowedHosts", json!(["mcp.example.com"])),
            ("gateway.mcp.allowedOrigins", json!(["https://app.example.com"])),
            ("gateway.mcp.clusterDomain", json!("corp.local")),
            ("networkPolicy.apiServer.cidrs", json!(["192.0.2.10/32"])),
            ("networkPolicy.apiServer.ports", json!([8443])),
        ],
    )
    .await
    .expect("helm template");
    let cfg = operator_config(&objs);
    assert_eq!(cfg["namespace"], "agents-sandbox");
    assert_eq!(
        cfg["images"]["python"],
        json!({"image": "python:3.13-slim", "interpreter": "/usr/local/bin/python3"}),
        "no runnerPath: the init container copies the runner in"
    );
    assert_eq!(
        cfg["images"]["javascript"]["runnerPath"],
        "/opt/toolrun-runner"
    );
    assert_eq!(cfg["images"]["bash"]["image"], "toolrun/sandbox:9.9.9");
    // A language on images.sandbox runs the runner the image carries (no init container).
    assert_eq!(
        cfg["images"]["bash"]["runnerPath"],
        "/usr/local/bin/toolrun-runner"
    );
    // ... unless images.sandbox.runnerPath is cleared: then the init container copies it in.
    let objs_init = render(&helm, &[("images.sandbox.runnerPath", json!(""))])
        .await
        .expect("helm template");
    let cfg_init = operator_config(&objs_init);
    assert!(
        cfg_init["images"]["bash"]["runnerPath"].is_null(),
        "{cfg_init}"
    );
    assert_eq!(cfg["runnerImage"], "toolrun/runner:0.1.0");
    assert_eq!(cfg["runtimeClassName"], "gvisor");
    assert_eq!(cfg["allowedRuntimeClassNames"], json!(["kata"]));
    assert_eq!(cfg["nodeSelector"], json!({"toolrun.dev/pool": "sandbox"}));
    assert_eq!(cfg["tolerations"][0]["key"], "toolrun.dev/sandbox");
    assert_eq!(cfg["defaultLimits"]["timeoutSeconds"], 10);
    assert_eq!(cfg["maxLimits"]["memoryMiB"], 4096);
    assert_eq!(cfg["defaultTtlSecondsAfterFinished"], 60);
    assert_eq!(cfg["controller"]["concurrency"], 4);

    // Everything namespaced for the sandbox follows sandbox.namespace.
    find(&objs, "Namespace", None, "agents-sandbox");
    find(
        &objs,
        "NetworkPolicy",
        Some("agents-sandbox"),
        "toolrun-sandbox-deny-all",
    );
    find(&objs, "Role", Some("agents-sandbox"), "toolrun-operator");
    find(&objs, "Role", Some("agents-sandbox"), "toolrun-gateway");
    let op = find(&objs, "Deployment", Some(NS), "toolrun-operator");
    assert_eq!(op["spec"]["replicas"], 2);
    assert_eq!(
        op["spec"]["template"]["metadata"]["annotations"]["prometheus.io/scrape"],
        "true"
    );
    let gw = find(&objs, "Deployment", Some(NS), "toolrun-gateway");
    assert_eq!(gw["spec"]["replicas"], 3);
    let c = &gw["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(c["image"], "registry.example/toolrun-gateway:0.1.0");
    assert_eq!(c["args"][4], "agents-sandbox");
    assert_eq!(
        c["args"].as_array().unwrap()[9..],
        [
            json!("--mcp-listen"),
            json!("0.0.0.0:8181"),
            json!("--max-open-rpcs"),
            json!("16384"),
            json!("--max-open-http-requests"),
            json!("1024"),
            json!("--max-message-bytes"),
            json!("4194304"),
            json!("--max-concurrent-streams"),
            json!("1024"),
            json!("--drain-timeout-ms"),
            json!("10000"),
            json!("--config"),
            json!("/etc/toolrun/toolrun.yaml"),
            json!("--api-keys"),
            json!("/etc/toolrun-keys/keys.yaml")
        ]
    );
    let gw_cm = find(&objs, "ConfigMap", Some(NS), "toolrun-gateway");
    let gw_cfg =
        &helm::parse_manifests(gw_cm["data"]["toolrun.yaml"].as_str().unwrap()).unwrap()[0];
    assert_eq!(gw_cfg["tools"]["calculator"]["enabled"], false);
    assert_eq!(
        gw_cfg["mcp"]["allowed_hosts"].as_array().unwrap()[5..],
        [
            json!(format!("toolrun-gateway.{NS}.svc.corp.local")),
            json!("mcp.example.com")
        ]
    );
    assert_eq!(
        gw_cfg["mcp"]["allowed_origins"],
        json!(["https://app.example.com"])
    );
    let svc = find(&objs, "Service", Some(NS), "toolrun-gateway");
    assert_eq!(svc["spec"]["ports"][2]["port"], 8181);
    assert_eq!(c["ports"][2]["containerPort"], 8181);
    assert_hardened_pod(gw);

    let np = find(&objs, "NetworkPolicy", Some(NS), "toolrun-operator");
    assert_eq!(
        np["spec"]["egress"],
        json!([{"ports": [{"protocol": "TCP", "port": 8443}], "to": [{"ipBlock": {"cidr": "192.0.2.10/32"}}]}])
    );

    // MCP off: no port, no policy rule, `--mcp-listen off`, and no config file without other
    // settings.
    let objs = render(
        &helm,
        &[
            ("gateway.mcp.enabled", json!(false)),
            ("gateway.maxRunsInFlight", json!(0)),
            // The default configured languages also go into the gateway's config file.
            ("languages.typescript", Value::Null),
            ("languages.c", Value::Null),
            // Sessions put the relay into the gateway's config file too.
            ("sessions.enabled", json!(false)),
            // And authentication its tenants' shares (auth.tenant_share_percent).
            ("gateway.auth.enabled", json!(false)),
        ],
    )
    .await
    .unwrap();
    let gw = find(&objs, "Deployment", Some(NS), "toolrun-gateway");
    let c = &gw["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(
        c["args"].as_array().unwrap()[9..],
        [
            json!("--mcp-listen"),
            json!("off"),
            json!("--max-open-rpcs"),
            json!("16384"),
            json!("--max-open-http-requests"),
            json!("1024"),
            json!("--max-message-bytes"),
            json!("4194304"),
            json!("--max-concurrent-streams"),
            json!("1024"),
            json!("--drain-timeout-ms"),
            json!("10000"),
            json!("--insecure-no-auth")
        ]
    );
    assert_eq!(c["ports"].as_array().unwrap().len(), 2);
    let svc = find(&objs, "Service", Some(NS), "toolrun-gateway");
    assert_eq!(svc["spec"]["ports"].as_array().unwrap().len(), 2);
    assert!(
        !objs
            .iter()
            .any(|o| o["kind"] == "ConfigMap" && o["metadata"]["name"] == "toolrun-gateway")
    );
    let np = find(&objs, "NetworkPolicy", Some(NS), "toolrun-gateway");
    assert_eq!(
        np["spec"]["ingress"][0]["ports"],
        json!([{"protocol": "TCP", "port": "grpc"}])
    );

    // A release without NetworkPolicies for our pods still has the sandbox's deny-all.
    let objs = render(&helm, &[("networkPolicy.enabled", json!(false))])
        .await
        .unwrap();
    let policies: Vec<&str> = objs
        .iter()
        .filter(|o| o["kind"] == "NetworkPolicy")
        .map(|o| o["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(policies, ["toolrun-sandbox-deny-all"]);

    // Without leader election the Lease Role goes too.
    let objs = render(
        &helm,
        &[("operator.controller.leaderElection.enabled", json!(false))],
    )
    .await
    .unwrap();
    assert!(
        !objs
            .iter()
            .any(|o| o["metadata"]["name"] == "toolrun-operator-leader-election")
    );

    // An existing sandbox namespace is not created (nor owned) by the release.
    let objs = render(&helm, &[("sandbox.createNamespace", json!(false))])
        .await
        .unwrap();
    assert!(!objs.iter().any(|o| o["kind"] == "Namespace"));
}

#[tokio::test]
async fn bad_values_are_rejected_with_the_key_named() {
    let Some(helm) = helm_or_skip("bad_values_are_rejected_with_the_key_named") else {
        return;
    };
    let cases: Vec<(Vec<(&str, Value)>, &str)> = vec![
        (
            vec![("sandbox.defaultLimits.memoryMiB", json!(-1))],
            "/sandbox/defaultLimits/memoryMiB",
        ),
        (
            vec![("sandbox.maxLimits.timeoutSeconds", json!(-30))],
            "/sandbox/maxLimits/timeoutSeconds",
        ),
        (
            vec![("sandbox.maxLimits.outputBytes", json!(1 << 20))],
            "/sandbox/maxLimits/outputBytes",
        ),
        (
            vec![("sandbox.defaultLimits.cpuMillis", json!(0))],
            "/sandbox/defaultLimits/cpuMillis",
        ),
        (
            vec![("sandbox.ttlSecondsAfterFinished", json!(-1))],
            "/sandbox/ttlSecondsAfterFinished",
        ),
        (
            vec![("sandbox.warmPool.python", json!(65))],
            "/sandbox/warmPool/python",
        ),
        (vec![("sessions.warmPool", json!(65))], "/sessions/warmPool"),
        (vec![("operator.replicas", json!(-1))], "/operator/replicas"),
        (
            vec![("operator.controller.apiQps", json!(0))],
            "/operator/controller/apiQps",
        ),
        (
            vec![("sandbox.timeout", json!(5))],
            "additional properties 'timeout'",
        ),
        (
            vec![("sandbox.defaultLimits.memory", json!(5))],
            "additional properties 'memory'",
        ),
        (
            vec![("operator.replica", json!(2))],
            "additional properties 'replica'",
        ),
        (
            vec![("images.gateway.pullPolicy", json!("Sometimes"))],
            "/images/gateway/pullPolicy",
        ),
        (
            vec![("languages.python.interpreter", json!("python3"))],
            "/languages/python/interpreter",
        ),
        (
            vec![("languages.bash.runnerPath", json!("toolrun-runner"))],
            "/languages/bash/runnerPath",
        ),
        (
            vec![(
                "languages.ruby",
                json!({"image": "ruby", "interpreter": "/usr/bin/ruby"}),
            )],
            "missing properties 'extension', 'command'",
        ),
        (
            vec![("sandbox.namespace", json!("Not_A_Namespace"))],
            "/sandbox/namespace",
        ),
        // (helm names the wrong path for propertyNames errors, so match the name itself)
        (
            vec![("sandbox.baseEnv", json!({"BAD-NAME": "x"}))],
            "invalid propertyName 'BAD-NAME'",
        ),
        (
            vec![("networkPolicy.apiServer.ports", json!([0]))],
            "/networkPolicy/apiServer/ports/0",
        ),
        // What the schema cannot say, the templates check.
        (
            vec![("sandbox.defaultLimits.memoryMiB", json!(4096))],
            "sandbox.defaultLimits.memoryMiB (4096) is above sandbox.maxLimits.memoryMiB (2048)",
        ),
        (
            vec![("sandbox.namespace", json!(NS))],
            "must differ from the release namespace",
        ),
        (
            vec![("images.runner.pullPolicy", json!("Always"))],
            "images.runner.pullPolicy and images.sandbox.pullPolicy must be equal",
        ),
        (
            vec![
                ("operator.replicas", json!(2)),
                ("operator.controller.leaderElection.enabled", json!(false)),
            ],
            "operator.replicas > 1 needs operator.controller.leaderElection.enabled",
        ),
        (
            vec![(
                "operator.controller.leaderElection.renewDeadlineSeconds",
                json!(20),
            )],
            "renewDeadlineSeconds (20) must be below leaseDurationSeconds (15)",
        ),
        (
            vec![("sandbox.tmpSizeMiB", json!(256))],
            "sandbox.tmpSizeMiB (256) must be below sandbox.defaultLimits.memoryMiB (256)",
        ),
        (
            vec![("sandbox.ttlSecondsAfterFinished", json!(604_801))],
            "/sandbox/ttlSecondsAfterFinished",
        ),
        // A bare `*` (every image) or a prefix that is not anchored at `/`, `:` or `@`.
        (
            vec![("sandbox.toolImages", json!(["*"]))],
            "/sandbox/toolImages/0",
        ),
        (
            vec![(
                "sandbox.toolImages",
                json!(["a:1", "registry.example.com*"]),
            )],
            "/sandbox/toolImages/1",
        ),
        (
            vec![
                ("sandbox.toolImages", json!(["a:1"])),
                (
                    "gateway.config.sandbox.kubernetes.toolImages",
                    json!(["b:1"]),
                ),
            ],
            "set sandbox.toolImages instead",
        ),
        (
            vec![("operator.controller.apiQps", json!(2.5))],
            "/operator/controller/apiQps",
        ),
        (vec![("gateway.mcp.port", json!(9090))], "/gateway/mcp/port"),
        (
            vec![("gateway.mcp.extraAllowedHosts", json!(["a b"]))],
            "/gateway/mcp/extraAllowedHosts/0",
        ),
        (
            vec![("gateway.mcp.allowedOrigins", json!(["example.com"]))],
            "/gateway/mcp/allowedOrigins/0",
        ),
        (
            vec![("gateway.config", json!({"mcp": {"allowed_hosts": ["*"]}}))],
            "gateway.config.mcp: set gateway.mcp",
        ),
        (
            vec![("gateway.config", json!({"auth": {"keys_file": "/x"}}))],
            "gateway.config.auth: set gateway.auth",
        ),
        (
            vec![("gateway.auth.firstKeyTenant", json!("Not_A_Tenant"))],
            "/gateway/auth/firstKeyTenant",
        ),
        (
            vec![("gateway.auth.firstKey", json!("short"))],
            "/gateway/auth/firstKey",
        ),
        (
            vec![("gateway.tls.clientCASecretName", json!("ca"))],
            "gateway.tls.clientCASecretName: client certificates need TLS",
        ),
        (
            vec![("gateway.config.sessions.workspace_size_mb", json!(64))],
            "gateway.config.sessions.workspace_size_mb: set sessions.workspaceSizeMiB instead",
        ),
        (
            vec![("sessions.workspaceSizeMiB", json!(8))],
            "/sessions/workspaceSizeMiB",
        ),
        (
            vec![
                ("gateway.tls.secretName", json!("gw-tls")),
                ("gateway.tls.clientAuth", json!("sometimes")),
            ],
            "/gateway/tls/clientAuth",
        ),
        (
            vec![("gateway.tls.secretName", json!("Not_A_Secret"))],
            "/gateway/tls/secretName",
        ),
        (
            vec![("gateway.maxOpenRpcs", json!(0))],
            "/gateway/maxOpenRpcs",
        ),
        (
            vec![("gateway.maxOpenHttpRequests", json!(-1))],
            "/gateway/maxOpenHttpRequests",
        ),
        (
            vec![("gateway.maxMessageBytes", json!("4MiB"))],
            "/gateway/maxMessageBytes",
        ),
        (
            vec![("gateway.drainTimeoutMs", json!(30000))],
            "/gateway/drainTimeoutMs",
        ),
        (
            vec![("gateway.auth.tenantSharePercent", json!(0))],
            "/gateway/auth/tenantSharePercent",
        ),
        (
            vec![("gateway.auth.tenantSharePercent", json!(101))],
            "/gateway/auth/tenantSharePercent",
        ),
        (
            vec![("gateway.config", json!({"tls": {"cert_file": "/x"}}))],
            "gateway.config.tls: set gateway.tls",
        ),
    ];
    for (values, message) in cases {
        match render(&helm, &values).await {
            Ok(_) => panic!("{values:?} was accepted"),
            Err(e) => {
                let e = format!("{e:#}");
                assert!(
                    e.contains(message),
                    "{values:?}: expected {message:?} in: {e}"
                );
            }
        }
    }
}

// ------------------------------------------------------------------------- on the cluster

async fn kubernetes_service_ip(client: &Client) -> Result<String> {
    Api::<Service>::namespaced(client.clone(), "default")
        .get("kubernetes")
        .await?
        .spec
        .and_then(|s| s.cluster_ip)
        .context("the kubernetes Service has no ClusterIP")
}

#[tokio::test]
async fn server_side_dry_run_passes_and_finds_the_api_server() {
    let test = "helm-dry-run-server";
    let Some(client) = cluster(test).await else {
        return;
    };
    let helm = Helm::find().expect("helm");
    let ns = format!("e2e-helm-dry-run-{}", std::process::id());
    let out = helm
        .run([
            "install",
            "toolrun",
            &helm::chart_dir().display().to_string(),
            "--namespace",
            &ns,
            "--create-namespace",
            "--set",
            &format!("sandbox.namespace={ns}-sbx"),
            "--dry-run=server",
        ])
        .await
        .expect("helm install --dry-run=server");
    // The manifest section of the output.
    let manifest = out
        .split_once("MANIFEST:\n")
        .map(|(_, m)| m.split("\nNOTES:").next().unwrap_or(m))
        .expect("a MANIFEST section");
    let objs = helm::parse_manifests(manifest).unwrap();
    assert_eq!(objs.iter().filter(|o| o["kind"] == "Deployment").count(), 2);
    // Helm looked at the cluster: the egress rule names the API server, not 0.0.0.0/0.
    let ip = kubernetes_service_ip(&client).await.unwrap();
    let np = objs
        .iter()
        .find(|o| o["kind"] == "NetworkPolicy" && o["metadata"]["name"] == "toolrun-operator")
        .unwrap();
    let cidrs: Vec<&str> = np["spec"]["egress"][0]["to"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["ipBlock"]["cidr"].as_str().unwrap())
        .collect();
    assert!(cidrs.contains(&format!("{ip}/32").as_str()), "{cidrs:?}");
    assert!(!cidrs.contains(&"0.0.0.0/0"), "{cidrs:?}");
    // The NOTES tell the next step.
    assert!(
        out.contains("port-forward svc/toolrun-gateway 50051:50051"),
        "{out}"
    );
    assert!(
        out.contains(&format!("kubectl get toolruns -n {ns}-sbx")),
        "{out}"
    );
    // Nothing was created.
    let namespaces: Api<Namespace> = Api::all(client);
    assert!(namespaces.get_opt(&ns).await.unwrap().is_none());
    assert!(
        namespaces
            .get_opt(&format!("{ns}-sbx"))
            .await
            .unwrap()
            .is_none()
    );
}

/// Labels the test namespace Pod Security `restricted`, so the release's own pods prove they
/// meet it.
async fn restrict(ns: &TestNs) -> Result<()> {
    let patch = json!({"metadata": {"labels": {
        "pod-security.kubernetes.io/enforce": "restricted",
        "pod-security.kubernetes.io/enforce-version": "latest",
    }}});
    Api::<Namespace>::all(ns.client.clone())
        .patch(&ns.name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

/// What the release put in the cluster, by kind and name (its instance label).
async fn release_objects(client: &Client, release: &Release) -> Result<Vec<String>> {
    let lp = ListParams::default().labels(&release.selector());
    let mut out = Vec::new();
    macro_rules! collect {
        ($kind:ty, $ns:expr) => {
            for o in Api::<$kind>::namespaced(client.clone(), $ns)
                .list(&lp)
                .await?
            {
                out.push(format!(
                    "{} {}/{}",
                    stringify!($kind),
                    $ns,
                    o.metadata.name.unwrap_or_default()
                ));
            }
        };
    }
    for ns in [&release.namespace, &release.sandbox_namespace] {
        collect!(Deployment, ns);
        collect!(Service, ns);
        collect!(ConfigMap, ns);
        collect!(Secret, ns);
        collect!(ServiceAccount, ns);
        collect!(Role, ns);
        collect!(RoleBinding, ns);
        collect!(NetworkPolicy, ns);
        collect!(Pod, ns);
    }
    for o in Api::<ClusterRole>::all(client.clone()).list(&lp).await? {
        out.push(format!(
            "ClusterRole {}",
            o.metadata.name.unwrap_or_default()
        ));
    }
    for o in Api::<ClusterRoleBinding>::all(client.clone())
        .list(&lp)
        .await?
    {
        out.push(format!(
            "ClusterRoleBinding {}",
            o.metadata.name.unwrap_or_default()
        ));
    }
    out.sort();
    Ok(out)
}

async fn assert_only_the_crd_remains(client: &Client, release: &Release) -> Result<()> {
    let left = release_objects(client, release).await?;
    ensure!(left.is_empty(), "left behind by helm uninstall: {left:?}");
    let namespaces: Api<Namespace> = Api::all(client.clone());
    ensure!(
        namespaces
            .get_opt(&release.sandbox_namespace)
            .await?
            .is_none(),
        "the sandbox namespace is still there"
    );
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    ensure!(
        crds.get_opt("toolruns.toolrun.dev").await?.is_some(),
        "the CRD was removed (Helm keeps CRDs of crds/)"
    );
    let out = release
        .helm
        .run([
            "list",
            "--namespace",
            &release.namespace,
            "--all",
            "--short",
        ])
        .await?;
    ensure!(out.trim().is_empty(), "helm still lists releases: {out}");
    Ok(())
}

/// A pod that `restricted` forbids must be refused in the sandbox namespace.
async fn assert_sandbox_namespace_enforces_restricted(client: &Client, ns: &str) -> Result<()> {
    let mut pod = sandbox_pod("privileged", &[], python("print(1)"));
    let spec = pod.spec.as_mut().unwrap();
    spec.security_context = None;
    spec.containers[0].security_context = Some(k8s_openapi::api::core::v1::SecurityContext {
        privileged: Some(true),
        ..Default::default()
    });
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    match pods.create(&PostParams::default(), &pod).await {
        Ok(_) => bail!("a privileged pod was admitted into the sandbox namespace {ns}"),
        Err(kube::Error::Api(e)) if e.code == 403 && e.message.contains("PodSecurity") => Ok(()),
        Err(e) => bail!("unexpected answer to a privileged pod: {e}"),
    }
}

#[tokio::test]
async fn install_is_available_and_uninstall_leaves_only_the_crd() {
    run_in_namespace("helm-install", |ns| async move {
        restrict(&ns).await?;
        let client = ns.client.clone();
        let mut release = install_chart(
            &client,
            &format!("r{}", &ns.name[ns.name.len() - 6..]),
            &ns.name,
            &[],
        )
        .await?;

        // The sandbox namespace and what the release made in it.
        let sbx: Namespace = Api::<Namespace>::all(client.clone())
            .get(&release.sandbox_namespace)
            .await?;
        let labels = sbx.metadata.labels.unwrap_or_default();
        for mode in ["enforce", "audit", "warn"] {
            ensure!(
                labels
                    .get(&format!("pod-security.kubernetes.io/{mode}"))
                    .map(String::as_str)
                    == Some("restricted"),
                "sandbox namespace lacks PSS {mode}=restricted: {labels:?}"
            );
        }
        assert_sandbox_namespace_enforces_restricted(&client, &release.sandbox_namespace).await?;
        let np: Api<NetworkPolicy> = Api::namespaced(client.clone(), &release.sandbox_namespace);
        let deny = np.get("toolrun-sandbox-deny-all").await?;
        let spec = deny.spec.context("deny-all has no spec")?;
        ensure!(spec.policy_types == Some(vec!["Ingress".into(), "Egress".into()]));
        ensure!(
            spec.ingress.unwrap_or_default().is_empty()
                && spec.egress.unwrap_or_default().is_empty()
        );

        // What a user does next (NOTES): call run_code through the gateway, see the ToolRun.
        // A ready gateway pod's address: the test runs on the node, which always has a
        // route to pods (not always one to the Service range).
        let gateway_ip = Api::<Pod>::namespaced(client.clone(), &release.namespace)
            .list(&ListParams::default().labels("app.kubernetes.io/component=gateway"))
            .await?
            .items
            .into_iter()
            .filter(is_ready)
            .find_map(|p| p.status.and_then(|s| s.pod_ip))
            .context("no ready gateway pod with an address")?;
        // Authentication is on by default: the chart's first key, read as NOTES.txt says,
        // from its Secret; a call without it is refused.
        let secret: Secret = Api::namespaced(client.clone(), &release.namespace)
            .get("toolrun-gateway-keys")
            .await?;
        let key = secret
            .data
            .as_ref()
            .and_then(|d| d.get("first-key"))
            .map(|b| String::from_utf8_lossy(&b.0).into_owned())
            .context("Secret toolrun-gateway-keys has no first-key")?;
        let channel = tonic::transport::Channel::from_shared(format!("http://{gateway_ip}:50051"))?
            .connect()
            .await?;
        let refused =
            toolrun_proto::v1::tool_service_client::ToolServiceClient::new(channel.clone())
                .list_tools(toolrun_proto::v1::ListToolsRequest {
                    format: 0,
                    include_disabled: false,
                })
                .await;
        ensure!(
            matches!(&refused, Err(s) if s.code() == tonic::Code::Unauthenticated),
            "a call without a key: {refused:?}"
        );
        let bearer: tonic::metadata::MetadataValue<tonic::metadata::Ascii> =
            format!("Bearer {key}").parse()?;
        let mut grpc = toolrun_proto::v1::tool_service_client::ToolServiceClient::with_interceptor(
            channel,
            move |mut r: tonic::Request<()>| {
                r.metadata_mut().insert("authorization", bearer.clone());
                Ok(r)
            },
        );
        let result = grpc
            .call_tool(toolrun_proto::v1::CallToolRequest {
                call_id: "helm-install-check".into(),
                tool: "run_code".into(),
                arguments_json: json!({"language": "python", "code": "print(6 * 7)"}).to_string(),
                timeout_ms: 0,
                session_id: String::new(),
            })
            .await?
            .into_inner()
            .result
            .context("CallTool returned no result")?;
        ensure!(result.ok, "run_code failed: {result:?}");
        let output: Value = serde_json::from_str(&result.output_json)?;
        ensure!(output["stdout"] == "42\n", "run_code output: {output}");
        let runs: Api<toolrun_crd::ToolRun> =
            Api::namespaced(client.clone(), &release.sandbox_namespace);
        let runs = runs.list(&ListParams::default()).await?.items;
        ensure!(
            runs.len() == 1 && runs[0].spec.call_id == "helm-install-check",
            "expected the call's ToolRun in {}: {runs:?}",
            release.sandbox_namespace
        );

        // The API server stored the Roles as rendered (no widening by aggregation etc.).
        let roles: Api<Role> = Api::namespaced(client.clone(), &release.sandbox_namespace);
        let op = serde_json::to_value(roles.get("toolrun-operator").await?)?;
        ensure!(
            grants(&op) == operator_sandbox_grants(),
            "operator Role: {op}"
        );

        release.uninstall().await?;
        assert_only_the_crd_remains(&client, &release).await
    })
    .await;
}

#[tokio::test]
async fn two_releases_live_side_by_side_and_uninstall_separately() {
    run_in_namespace("helm-two-releases-a", |a| async move {
        let b = TestNs::create(&a.client, "helm-two-releases-b").await?;
        let outcome = two_releases(&a, &b).await;
        if outcome.is_err() {
            b.dump().await;
        }
        b.delete().await;
        outcome
    })
    .await;
}

async fn two_releases(a: &TestNs, b: &TestNs) -> Result<()> {
    restrict(a).await?;
    restrict(b).await?;
    let client = a.client.clone();
    // Installed at once: both ship the CRD in crds/, which Helm creates only when missing.
    let (ra, rb) = tokio::join!(
        install_only(&client, "toolrun-a", &a.name, &[]),
        install_only(&client, "toolrun-b", &b.name, &[]),
    );
    let (mut ra, rb) = (ra?, rb?);
    ensure!(ra.sandbox_namespace != rb.sandbox_namespace);
    let limit = Duration::from_secs(180);
    let (wa, wb) = tokio::join!(ra.wait_available(limit), rb.wait_available(limit));
    if wa.is_err() || wb.is_err() {
        ra.dump().await;
        rb.dump().await;
        wa?;
        wb?;
    }
    ensure!(!release_objects(&client, &ra).await?.is_empty());

    // Removing one release leaves the other whole and working.
    ra.uninstall().await?;
    assert_only_the_crd_remains(&client, &ra).await?;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &rb.namespace);
    for name in helm::DEPLOYMENTS {
        ensure!(
            helm::deployment_available(&deployments.get(name).await?),
            "{name} of the other release is no longer Available"
        );
    }
    let namespaces: Api<Namespace> = Api::all(client.clone());
    ensure!(namespaces.get_opt(&rb.sandbox_namespace).await?.is_some());
    let np: Api<NetworkPolicy> = Api::namespaced(client.clone(), &rb.sandbox_namespace);
    ensure!(np.get_opt("toolrun-sandbox-deny-all").await?.is_some());
    let mut rb = rb;
    rb.uninstall().await?;
    assert_only_the_crd_remains(&client, &rb).await
}

/// A pod that tries each `host:port` once a second until it sees the same outcome (`open` or
/// `blocked`) three times in a row, and prints `RESULT host:port outcome` for each.
fn probe_pod(name: &str, labels: &[(&str, &str)], targets: &[(String, u16)]) -> Pod {
    let targets: Vec<String> = targets
        .iter()
        .map(|(h, p)| format!("(\"{h}\", {p})"))
        .collect();
    let script = format!(
        r#"
import socket, sys, time
for host, port in [{}]:
    last, streak, result = None, 0, "undecided"
    for attempt in range(40):
        try:
            socket.create_connection((host, port), timeout=2).close()
            now = "open"
        except OSError as e:
            now = "blocked"
        streak = streak + 1 if now == last else 1
        last = now
        if streak == 3:
            result = now
            break
        time.sleep(1)
    print("RESULT", f"{{host}}:{{port}}", result, flush=True)
"#,
        targets.join(", ")
    );
    sandbox_pod(name, labels, python(&script))
}

async fn probe_results(ns: &TestNs, name: &str) -> Result<BTreeMap<String, String>> {
    let pods = ns.pods();
    let pod = wait_pod(
        &pods,
        name,
        Duration::from_secs(240),
        "finished",
        is_finished,
    )
    .await?;
    let log = logs(&pods, name).await?;
    ensure!(
        phase(&pod) == "Succeeded",
        "probe {name} ended {}: {log}",
        phase(&pod)
    );
    Ok(log
        .lines()
        .filter_map(|l| l.strip_prefix("RESULT "))
        .filter_map(|l| l.split_once(' '))
        .map(|(t, r)| (t.to_string(), r.trim().to_string()))
        .collect())
}

#[tokio::test]
async fn network_policies_let_our_pods_reach_only_the_api_server() {
    run_in_namespace("helm-network-policies", |ns| async move {
        restrict(&ns).await?;
        let client = ns.client.clone();
        // No gateway or operator pods: stand-ins carry their labels, so this proves the
        // policies whatever the images do.
        let mut release = install_only(
            &client,
            "toolrun-np",
            &ns.name,
            &[
                ("operator.replicas", json!(0)),
                ("gateway.replicas", json!(0)),
            ],
        )
        .await?;
        let outcome = network_policies(&ns, &release).await;
        if outcome.is_err() {
            release.dump().await;
        }
        release.uninstall().await?;
        outcome
    })
    .await;
}

async fn network_policies(ns: &TestNs, release: &Release) -> Result<()> {
    let pods = ns.pods();
    let labels = |component: &'static str| {
        [
            ("app.kubernetes.io/name", "toolrun"),
            ("app.kubernetes.io/instance", "toolrun-np"),
            ("app.kubernetes.io/component", component),
        ]
    };
    // A server no policy selects (reachable by anyone not held back by egress rules), and a
    // gateway stand-in listening on its gRPC port and on a port the policy does not open.
    let server = |name: &str, labels: &[(&str, &str)], ports: &[(&str, i32)]| {
        let cmd: Vec<String> = ports
            .iter()
            .map(|(_, p)| format!("python3 -m http.server {p} --directory /tmp &"))
            .collect();
        let mut pod = sandbox_pod(
            name,
            labels,
            vec![
                "bash".into(),
                "-c".into(),
                format!("{} wait", cmd.join(" ")),
            ],
        );
        let c = &mut pod.spec.as_mut().unwrap().containers[0];
        c.ports = Some(
            ports
                .iter()
                .map(|(n, p)| k8s_openapi::api::core::v1::ContainerPort {
                    name: (!n.is_empty()).then(|| n.to_string()),
                    container_port: *p,
                    ..Default::default()
                })
                .collect(),
        );
        c.readiness_probe = Some(k8s_openapi::api::core::v1::Probe {
            tcp_socket: Some(TCPSocketAction {
                port: IntOrString::Int(ports[ports.len() - 1].1),
                ..Default::default()
            }),
            period_seconds: Some(1),
            ..Default::default()
        });
        pod
    };
    pods.create(
        &PostParams::default(),
        &server("plain-server", &[("role", "server")], &[("", 8080)]),
    )
    .await?;
    pods.create(
        &PostParams::default(),
        &server(
            "fake-gateway",
            &labels("gateway"),
            &[("grpc", 50051), ("", 8081)],
        ),
    )
    .await?;
    let ip = |p: Pod| p.status.and_then(|s| s.pod_ip).context("server has no IP");
    let plain = ip(wait_pod(
        &pods,
        "plain-server",
        Duration::from_secs(120),
        "ready",
        is_ready,
    )
    .await?)?;
    let gw = ip(wait_pod(
        &pods,
        "fake-gateway",
        Duration::from_secs(120),
        "ready",
        is_ready,
    )
    .await?)?;
    let api = kubernetes_service_ip(&ns.client).await?;

    let plain_t = (plain.clone(), 8080);
    let api_t = (api.clone(), 443);
    let probes = [
        // No policy selects it: everything is open (the control: blocked below means the
        // policy blocked it, not a dead server).
        (
            "control",
            vec![("role", "client")],
            vec![plain_t.clone(), (gw.clone(), 50051), (gw.clone(), 8081)],
        ),
        (
            "as-operator",
            labels("operator").to_vec(),
            vec![api_t.clone(), plain_t.clone()],
        ),
        (
            "as-gateway",
            labels("gateway").to_vec(),
            vec![api_t.clone(), plain_t.clone()],
        ),
    ];
    for (name, labels, targets) in &probes {
        pods.create(&PostParams::default(), &probe_pod(name, labels, targets))
            .await?;
    }
    let mut got = BTreeMap::new();
    for (name, _, _) in &probes {
        for (target, result) in probe_results(ns, name).await? {
            got.insert(format!("{name} -> {target}"), result);
        }
    }
    let want = BTreeMap::from([
        (format!("control -> {plain}:8080"), "open"),
        (format!("control -> {gw}:50051"), "open"),
        (format!("control -> {gw}:8081"), "blocked"),
        (format!("as-operator -> {api}:443"), "open"),
        (format!("as-operator -> {plain}:8080"), "blocked"),
        (format!("as-gateway -> {api}:443"), "open"),
        (format!("as-gateway -> {plain}:8080"), "blocked"),
    ]);
    let want: BTreeMap<String, String> =
        want.into_iter().map(|(k, v)| (k, v.to_string())).collect();
    ensure!(
        got == want,
        "connections:\n got {got:#?}\nwant {want:#?} (release {})",
        release.name
    );
    Ok(())
}

/// The rendered `operator.yaml` text.
fn operator_yaml(objs: &[Value]) -> String {
    find(objs, "ConfigMap", Some(NS), "toolrun-operator")["data"]["operator.yaml"]
        .as_str()
        .expect("operator.yaml in the ConfigMap")
        .to_string()
}

/// The gateway's rendered config file (`toolrun.yaml`), parsed.
fn gateway_config(objs: &[Value]) -> Value {
    let cm = find(objs, "ConfigMap", Some(NS), "toolrun-gateway");
    helm::parse_manifests(cm["data"]["toolrun.yaml"].as_str().unwrap())
        .unwrap()
        .remove(0)
}

#[tokio::test]
async fn tool_images_reach_the_gateway_and_the_operator_alike() {
    use toolrun_operator::Config;
    let Some(helm) = helm_or_skip("tool_images_reach_the_gateway_and_the_operator_alike") else {
        return;
    };
    // Default: none, on both sides (the gateway's file does not even name the key).
    let objs = render(&helm, &[]).await.unwrap();
    let op = Config::from_yaml(&operator_yaml(&objs)).unwrap();
    assert!(op.operator.tool_images.is_empty());
    let has_cm = objs
        .iter()
        .any(|o| o["kind"] == "ConfigMap" && o["metadata"]["name"] == "toolrun-gateway");
    if has_cm {
        let gw = gateway_config(&objs);
        assert!(gw["sandbox"]["kubernetes"]["toolImages"].is_null(), "{gw}");
    }
    // Listed: the same list in both configurations, which the operator's parser accepts.
    let list = json!(["toolrun/sandbox:0.1.0", "registry.example.com/tools/*"]);
    let objs = render(&helm, &[("sandbox.toolImages", list.clone())])
        .await
        .unwrap();
    let op = Config::from_yaml(&operator_yaml(&objs)).unwrap();
    assert_eq!(
        op.operator.tool_images,
        ["toolrun/sandbox:0.1.0", "registry.example.com/tools/*"]
    );
    let gw = gateway_config(&objs);
    assert_eq!(gw["sandbox"]["kubernetes"]["toolImages"], list, "{gw}");
    // Beside other gateway settings of the same section, which are kept.
    let objs = render(
        &helm,
        &[
            ("sandbox.toolImages", list.clone()),
            (
                "gateway.config.sandbox.kubernetes.startTimeoutSeconds",
                json!(90),
            ),
        ],
    )
    .await
    .unwrap();
    let gw = gateway_config(&objs);
    assert_eq!(gw["sandbox"]["kubernetes"]["toolImages"], list, "{gw}");
    assert_eq!(
        gw["sandbox"]["kubernetes"]["startTimeoutSeconds"], 90,
        "{gw}"
    );
}

#[tokio::test]
async fn operator_yaml_loads_with_the_operators_own_parser() {
    use toolrun_operator::Config;
    let Some(helm) = helm_or_skip("operator_yaml_loads_with_the_operators_own_parser") else {
        return;
    };
    // Default values: exactly the operator's built-in defaults.
    let objs = render(&helm, &[]).await.unwrap();
    let mut config = Config::from_yaml(&operator_yaml(&objs)).expect("default operator.yaml loads");
    // ... plus the chart's configured languages, on the sandbox image and its runner.
    let languages = std::mem::take(&mut config.operator.languages);
    assert_eq!(languages.keys().collect::<Vec<_>>(), ["c", "typescript"]);
    let c = &languages["c"];
    assert_eq!(
        (c.extension.as_str(), c.image.interpreter.as_str()),
        ("c", "/bin/bash")
    );
    assert!(c.command.starts_with("gcc ") && c.command.contains("{source}"));
    assert_eq!(c.image, Config::default().operator.images.bash);
    // ... and the chart's warm pools (the operator keeps none unless told).
    let warm = std::mem::take(&mut config.operator.warm_pool);
    assert_eq!(warm, [("python".to_string(), 2)].into());
    assert_eq!(std::mem::take(&mut config.operator.session_warm_pool), 1);
    // The gateway's default workspace size, which is the operator's.
    assert_eq!(config.operator.session_workspace_mib, 1024);
    // Session pods request 50m CPU of their limit (the operator alone: the limit).
    assert_eq!(
        std::mem::take(&mut config.operator.session_cpu_request_millis),
        Some(50)
    );
    assert_eq!(config, Config::default());
    // 0: the operator's own default (Guaranteed session pods).
    let objs = render(&helm, &[("sessions.cpuRequestMillis", json!(0))])
        .await
        .unwrap();
    let config = Config::from_yaml(&operator_yaml(&objs)).unwrap();
    assert_eq!(config.operator.session_cpu_request_millis, None);

    // Every value the chart passes on arrives where the operator reads it.
    let objs = render(
        &helm,
        &[
            ("sandbox.namespace", json!("agents-sandbox")),
            ("languages.javascript.image", json!("node:22-slim")),
            ("languages.javascript.interpreter", json!("/usr/local/bin/node")),
            ("images.runner.tag", json!("1.2.3")),
            ("images.runner.pullPolicy", json!("Always")),
            ("images.sandbox.pullPolicy", json!("Always")),
            ("sandbox.runtimeClassName", json!("gvisor")),
            ("sandbox.allowedRuntimeClassNames", json!(["kata"])),
            ("sandbox.nodeSelector", json!({"pool": "sandbox"})),
            (
                "sandbox.tolerations",
                json!([{"key": "sandbox", "operator": "Exists", "effect": "NoSchedule"}]),
            ),
            ("sandbox.defaultLimits", json!({"timeoutSeconds": 5, "memoryMiB": 128, "cpuMillis": 250, "processes": 32, "outputBytes": 4096})),
            ("sandbox.maxLimits.processes", json!(128)),
            ("sandbox.ttlSecondsAfterFinished", json!(0)),
            ("sandbox.baseEnv", json!({"EXTRA": "1"})),
            ("sandbox.tmpSizeMiB", json!(32)),
            ("sandbox.ephemeralStorageMiB", json!(128)),
            ("sandbox.userNamespaces", json!(true)),
            ("sandbox.warmPool", json!({"python": 0, "bash": 3})),
            ("sessions.warmPool", json!(3)),
            ("sessions.workspaceSizeMiB", json!(256)),
            ("operator.controller.concurrency", json!(8)),
            ("operator.controller.apiQps", json!(20)),
            ("operator.controller.apiBurst", json!(40)),
            ("operator.controller.leaderElection", json!({"enabled": false, "leaseName": "other", "leaseDurationSeconds": 30, "renewDeadlineSeconds": 20, "retryPeriodSeconds": 5})),
        ],
    )
    .await
    .unwrap();
    let c = Config::from_yaml(&operator_yaml(&objs)).expect("customised operator.yaml loads");
    let o = &c.operator;
    assert_eq!(o.namespace, "agents-sandbox");
    assert_eq!(o.images.javascript.image, "node:22-slim");
    assert_eq!(o.images.javascript.interpreter, "/usr/local/bin/node");
    assert_eq!(o.images.python.image, "toolrun/sandbox:0.1.0");
    assert_eq!(o.runner_image, "toolrun/runner:1.2.3");
    assert_eq!(o.image_pull_policy.as_deref(), Some("Always"));
    assert_eq!(o.runtime_class_name.as_deref(), Some("gvisor"));
    assert_eq!(o.allowed_runtime_class_names, ["kata"]);
    assert_eq!(
        o.node_selector.get("pool").map(String::as_str),
        Some("sandbox")
    );
    assert_eq!(o.tolerations[0].key.as_deref(), Some("sandbox"));
    assert_eq!(o.tolerations[0].effect.as_deref(), Some("NoSchedule"));
    assert_eq!(
        (
            o.default_limits.timeout_seconds,
            o.default_limits.memory_mib,
            o.default_limits.cpu_millis
        ),
        (5, 128, 250)
    );
    assert_eq!(
        (o.default_limits.processes, o.default_limits.output_bytes),
        (32, 4096)
    );
    assert_eq!(o.max_limits.processes, 128);
    assert_eq!(o.warm_pool.get("bash"), Some(&3));
    assert_eq!(o.warm_pool.get("python"), Some(&0));
    assert_eq!(o.session_warm_pool, 3);
    assert_eq!(o.session_workspace_mib, 256);
    assert_eq!(o.default_ttl_seconds_after_finished, 0);
    // baseEnv values merge onto the chart's defaults (Helm merges maps).
    assert_eq!(o.base_env.get("EXTRA").map(String::as_str), Some("1"));
    assert_eq!(o.base_env.get("HOME").map(String::as_str), Some("/tmp"));
    assert_eq!((o.tmp_size_mib, o.ephemeral_storage_mib), (32, 128));
    assert!(o.user_namespaces);
    let k = &c.controller;
    assert_eq!((k.concurrency, k.api_qps, k.api_burst), (8, 20, 40));
    let le = &k.leader_election;
    assert!(!le.enabled);
    assert_eq!(le.lease_name, "other");
    assert_eq!(
        (
            le.lease_duration_seconds,
            le.renew_deadline_seconds,
            le.retry_period_seconds
        ),
        (30, 20, 5)
    );
    assert_eq!(
        k.metrics_listen.port(),
        9090,
        "the probes and the Service use 9090"
    );
}

#[tokio::test]
async fn web_egress_opens_public_addresses_only_when_enabled() {
    let Some(helm) = helm_or_skip("web_egress_opens_public_addresses_only_when_enabled") else {
        return;
    };
    // Off by default: the gateway reaches the API server only (one egress rule).
    let objs = render(&helm, &[]).await.unwrap();
    let np = find(&objs, "NetworkPolicy", Some(NS), "toolrun-gateway");
    assert_eq!(np["spec"]["egress"].as_array().unwrap().len(), 1);

    let objs = render(
        &helm,
        &[
            ("gateway.web.egress", json!(true)),
            ("gateway.web.searchApiKeySecret.name", json!("search-key")),
        ],
    )
    .await
    .unwrap();
    let np = find(&objs, "NetworkPolicy", Some(NS), "toolrun-gateway");
    let egress = np["spec"]["egress"].as_array().unwrap();
    assert_eq!(egress.len(), 3, "API server, public addresses, DNS");
    let public = &egress[1];
    assert_eq!(
        public["ports"],
        json!([{"protocol": "TCP", "port": 80}, {"protocol": "TCP", "port": 443}])
    );
    let v4 = &public["to"][0]["ipBlock"];
    assert_eq!(v4["cidr"], "0.0.0.0/0");
    for private in [
        "10.0.0.0/8",
        "172.16.0.0/12",
        "192.168.0.0/16",
        "127.0.0.0/8",
        "169.254.0.0/16",
        "100.64.0.0/10",
    ] {
        assert!(
            v4["except"].as_array().unwrap().contains(&json!(private)),
            "{private}"
        );
    }
    let v6 = &public["to"][1]["ipBlock"];
    assert_eq!(v6["cidr"], "::/0");
    for private in ["::/8", "fc00::/7", "fe80::/10"] {
        assert!(
            v6["except"].as_array().unwrap().contains(&json!(private)),
            "{private}"
        );
    }
    assert_eq!(
        egress[2]["ports"],
        json!([{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}])
    );
    // Sandbox pods keep their deny-all policy, untouched.
    let deny = objs
        .iter()
        .find(|o| {
            o["kind"] == "NetworkPolicy" && o["metadata"]["name"] == "toolrun-sandbox-deny-all"
        })
        .expect("the sandbox's deny-all policy");
    assert_eq!(
        deny["spec"]["podSelector"]["matchLabels"]["toolrun.dev/sandbox"],
        "true"
    );
    assert_eq!(deny["spec"]["policyTypes"], json!(["Ingress", "Egress"]));
    assert!(
        deny["spec"]
            .get("egress")
            .is_none_or(|e| e.as_array().is_some_and(|a| a.is_empty()))
    );
    // The key reaches the gateway as the named variable.
    let gw = find(&objs, "Deployment", Some(NS), "toolrun-gateway");
    let env = &gw["spec"]["template"]["spec"]["containers"][0]["env"];
    assert!(
        env.as_array()
            .unwrap()
            .iter()
            .any(|e| e["name"] == "BRAVE_SEARCH_API_KEY"
                && e["valueFrom"]["secretKeyRef"]["name"] == "search-key"),
        "{env}"
    );
}

/// Sessions: the operator's relay is a ClusterIP port admitted from the gateway's pods only,
/// both mount the same generated token, the gateway's config names the relay, and only the
/// operator may attach to pods (the gateway's Role has no pods/attach or pods/exec).
#[tokio::test]
async fn the_session_relay_is_reachable_only_from_the_gateway_with_a_shared_token() {
    let Some(helm) =
        helm_or_skip("the_session_relay_is_reachable_only_from_the_gateway_with_a_shared_token")
    else {
        return;
    };
    let objs = render(&helm, &[]).await.expect("helm template");
    let selector = |component: &str| {
        json!({
            "app.kubernetes.io/name": "toolrun",
            "app.kubernetes.io/instance": "toolrun",
            "app.kubernetes.io/component": component,
        })
    };
    let svc = find(&objs, "Service", Some(NS), "toolrun-operator-relay");
    assert_eq!(svc["spec"]["type"], "ClusterIP");
    assert_eq!(svc["spec"]["selector"], selector("operator"));
    assert_eq!(
        svc["spec"]["ports"],
        json!([{"name": "relay", "port": 50052, "targetPort": "relay", "protocol": "TCP", "appProtocol": "grpc"}])
    );
    let ingress = find(&objs, "NetworkPolicy", Some(NS), "toolrun-operator-relay");
    assert_eq!(
        ingress["spec"]["podSelector"]["matchLabels"],
        selector("operator")
    );
    assert_eq!(
        ingress["spec"]["ingress"],
        json!([{"from": [{"podSelector": {"matchLabels": selector("gateway")}}],
                "ports": [{"protocol": "TCP", "port": "relay"}]}])
    );
    let egress = find(&objs, "NetworkPolicy", Some(NS), "toolrun-gateway-relay");
    assert_eq!(egress["spec"]["policyTypes"], json!(["Egress"]));
    assert_eq!(
        egress["spec"]["egress"],
        json!([{"to": [{"podSelector": {"matchLabels": selector("operator")}}],
                "ports": [{"protocol": "TCP", "port": 50052}]}])
    );
    // The token: generated, long, the one Secret both pods mount.
    let secret = find(&objs, "Secret", Some(NS), "toolrun-session-relay");
    let token = secret["data"]["token"].as_str().expect("token");
    assert!(token.len() >= 64, "a 48-character token, base64: {token}");
    for name in ["toolrun-gateway", "toolrun-operator"] {
        let d = find(&objs, "Deployment", Some(NS), name);
        let spec = &d["spec"]["template"]["spec"];
        let vol = spec["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == "relay-token")
            .unwrap_or_else(|| panic!("{name}: no relay-token volume"));
        assert_eq!(
            vol["secret"]["secretName"], "toolrun-session-relay",
            "{name}"
        );
        let mount = spec["containers"][0]["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["name"] == "relay-token")
            .unwrap_or_else(|| panic!("{name}: relay-token not mounted"));
        assert_eq!(mount["mountPath"], "/etc/toolrun-relay");
        assert_eq!(mount["readOnly"], true);
    }
    let op = find(&objs, "Deployment", Some(NS), "toolrun-operator");
    let args: Vec<&str> = op["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert!(
        args.windows(2)
            .any(|w| w == ["--relay-listen", "0.0.0.0:50052"]),
        "{args:?}"
    );
    assert!(
        args.windows(2)
            .any(|w| w == ["--relay-token-file", "/etc/toolrun-relay/token"]),
        "{args:?}"
    );
    let cm = find(&objs, "ConfigMap", Some(NS), "toolrun-gateway");
    let config =
        helm::parse_manifests(cm["data"]["toolrun.yaml"].as_str().unwrap()).unwrap()[0].clone();
    assert_eq!(
        config["sandbox"]["kubernetes"]["sessionRelay"],
        json!({"address": format!("http://toolrun-operator-relay.{NS}.svc:50052"),
               "tokenFile": "/etc/toolrun-relay/token"})
    );
    // Workspaces are emptyDirs unless a StorageClass is given.
    assert!(
        config["sandbox"]["kubernetes"]
            .get("sessionStorageClassName")
            .is_none(),
        "{config}"
    );
    let objs = render(&helm, &[("sessions.storageClassName", json!("local-disk"))])
        .await
        .expect("helm template with a StorageClass");
    let cm = find(&objs, "ConfigMap", Some(NS), "toolrun-gateway");
    let with_class =
        helm::parse_manifests(cm["data"]["toolrun.yaml"].as_str().unwrap()).unwrap()[0].clone();
    assert_eq!(
        with_class["sandbox"]["kubernetes"]["sessionStorageClassName"],
        "local-disk"
    );
    // Only the operator attaches; the gateway can neither attach nor exec.
    let gateway = grants(find(&objs, "Role", Some(SANDBOX_NS), "toolrun-gateway"));
    assert!(
        !gateway
            .iter()
            .any(|g| g.contains("pods/attach") || g.contains("pods/exec")),
        "{gateway:?}"
    );
    assert!(
        grants(find(&objs, "Role", Some(SANDBOX_NS), "toolrun-operator"))
            .contains("/pods/attach:create")
    );

    // Control: sessions off, and nothing of the relay is rendered.
    let objs = render(&helm, &[("sessions.enabled", json!(false))])
        .await
        .expect("helm template");
    for o in &objs {
        let text = o.to_string();
        assert!(!text.contains("relay"), "{}", o["metadata"]);
    }
}
