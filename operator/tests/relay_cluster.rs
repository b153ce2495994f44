//! The session relay on the real cluster: a ToolSession whose status names an agent pod (the
//! test writes the status, standing for the operator's ToolSession controller), the relay
//! serving in process with the real client: the ToolSession read through the API, the pod
//! reached through `pods/attach`, the agent's core answering. Skipped without a cluster
//! (fails instead with TOOLRUN_REQUIRE_CLUSTER=1).
//!
//! Run: `eval "$(tests/cluster/env)" && TOOLRUN_REQUIRE_CLUSTER=1 cargo test -p
//! toolrun-operator --test relay_cluster`.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, CustomResourceExt};
use serde_json::{Value, json};
use toolrun_crd::{ToolSession, ToolSessionSpec};
use toolrun_e2e::{run_in_namespace, wait_until};
use toolrun_operator::session::relay_server::{self, RelayServerConfig, codes};
use toolrun_operator::toolrun::builders::{agent_pod, network_policy};
use toolrun_proto::relay::session_relay_client::SessionRelayClient;
use toolrun_proto::relay::{FileOpRequest, file_op_reply};

const TOKEN: &str = "cluster-relay-token-0123456789abcdef";

async fn ensure_session_crd(client: &kube::Client) -> Result<()> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let name = "toolsessions.toolrun.dev";
    if crds.get_opt(name).await?.is_none() {
        match crds
            .create(&PostParams::default(), &ToolSession::crd())
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => return Err(e).context("installing the ToolSession CRD"),
        }
    }
    wait_until(
        Duration::from_secs(30),
        "the ToolSession CRD established",
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

async fn file_op(
    c: &mut SessionRelayClient<tonic::transport::Channel>,
    session: &str,
    tenant: &str,
    op: &str,
    args: Value,
) -> Result<Result<Value, (String, String)>> {
    let mut req = tonic::Request::new(FileOpRequest {
        session: session.into(),
        tenant: tenant.into(),
        request_id: format!("{op}-{}", std::process::id() as u64 * 1000 + rand_small()),
        op: op.into(),
        args_json: args.to_string(),
    });
    req.metadata_mut()
        .insert("authorization", format!("Bearer {TOKEN}").parse()?);
    let reply = c.file_op(req).await?.into_inner();
    Ok(match reply.outcome.context("no outcome")? {
        file_op_reply::Outcome::ResultJson(j) => Ok(serde_json::from_str(&j)?),
        file_op_reply::Outcome::Error(e) => Err((e.code, e.message)),
    })
}

fn rand_small() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

#[tokio::test]
async fn the_relay_reaches_a_session_pod_through_attach() {
    run_in_namespace("op-relay", |ns| async move {
        ensure_session_crd(&ns.client).await?;
        let mut config = toolrun_operator::Config::default();
        config.operator.namespace = ns.name.clone();
        ns.api::<k8s_openapi::api::networking::v1::NetworkPolicy>()
            .create(&PostParams::default(), &network_policy(&ns.name))
            .await?;
        // An agent pod serving /tmp (its memory-backed scratch volume) as the workspace.
        let pods = ns.api::<Pod>();
        let mut pod = agent_pod("sess-pod", "bash", BTreeMap::new(), &config.operator)?;
        let c = &mut pod.spec.as_mut().unwrap().containers[0];
        c.command
            .as_mut()
            .unwrap()
            .extend(["--workspace".to_string(), "/tmp".to_string()]);
        pods.create(&PostParams::default(), &pod).await?;
        wait_until(Duration::from_secs(90), "the agent pod running", || async {
            Ok(pods
                .get("sess-pod")
                .await?
                .status
                .and_then(|s| s.phase)
                .as_deref()
                == Some("Running"))
        })
        .await?;
        // The ToolSession, Ready on that pod (as the operator's controller would write it).
        let sessions = ns.api::<ToolSession>();
        let mut ts = ToolSession::new(
            "ts-1",
            ToolSessionSpec {
                session_id: "s-1".into(),
                approval_mode: Default::default(),
                idle_timeout_seconds: Some(600),
                workspace: Default::default(),
                limits: Default::default(),
                runtime_class_name: None,
            },
        );
        ts.metadata.labels = Some(BTreeMap::from([(
            toolrun_crd::labels::TENANT.to_string(),
            "acme".to_string(),
        )]));
        sessions.create(&PostParams::default(), &ts).await?;
        sessions
            .patch_status(
                "ts-1",
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"phase": "Ready", "podName": "sess-pod"}})),
            )
            .await?;

        let token_file = std::env::temp_dir().join(format!("relay-token-{}", ns.name));
        std::fs::write(&token_file, TOKEN)?;
        let stop = tokio_util::sync::CancellationToken::new();
        let _guard = stop.clone().drop_guard();
        let relay_config = RelayServerConfig::new("127.0.0.1:0".parse()?, token_file);
        let pool = relay_server::session_pool(ns.client.clone(), &ns.name);
        let addr = relay_server::start(ns.client.clone(), &ns.name, &relay_config, pool, stop)
            .await
            .map_err(anyhow::Error::msg)?;
        let mut c = SessionRelayClient::connect(format!("http://{addr}")).await?;

        let w = file_op(
            &mut c,
            "ts-1",
            "acme",
            "write_file",
            json!({"path": "a.txt", "content": "hello\n"}),
        )
        .await?;
        ensure!(w.as_ref().is_ok_and(|v| v["created"] == true), "{w:?}");
        let t = std::time::Instant::now();
        let r = file_op(
            &mut c,
            "ts-1",
            "acme",
            "read_file",
            json!({"path": "a.txt"}),
        )
        .await?;
        eprintln!("read_file through the relay (attached): {:?}", t.elapsed());
        ensure!(
            r.as_ref().is_ok_and(|v| v["content"] == "     1\thello\n"),
            "{r:?}"
        );
        let e = file_op(
            &mut c,
            "ts-1",
            "acme",
            "read_file",
            json!({"path": "../etc/passwd"}),
        )
        .await?;
        ensure!(
            e.as_ref().is_err_and(|(code, _)| code == "INVALID_PATH"),
            "{e:?}"
        );
        let e = file_op(
            &mut c,
            "ts-1",
            "other",
            "read_file",
            json!({"path": "a.txt"}),
        )
        .await?;
        ensure!(
            e.as_ref()
                .is_err_and(|(code, _)| code == codes::SESSION_NOT_FOUND),
            "{e:?}"
        );
        // Not Ready: the status says why.
        sessions
            .patch_status(
                "ts-1",
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"phase": "Failed", "message": "the pod died"}})),
            )
            .await?;
        wait_until(Duration::from_secs(20), "SESSION_NOT_READY", || {
            let mut c = c.clone();
            async move {
                let e = file_op(
                    &mut c,
                    "ts-1",
                    "acme",
                    "read_file",
                    json!({"path": "a.txt"}),
                )
                .await?;
                Ok(e.is_err_and(|(code, m)| {
                    code == codes::SESSION_NOT_READY && m.contains("the pod died")
                }))
            }
        })
        .await?;
        // The pod gone (the status still naming it): AGENT_UNREACHABLE within bounds.
        sessions
            .patch_status(
                "ts-1",
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"phase": "Ready", "message": null}})),
            )
            .await?;
        pods.delete("sess-pod", &DeleteParams::default().grace_period(0))
            .await?;
        wait_until(Duration::from_secs(60), "the pod gone", || async {
            Ok(pods.get_opt("sess-pod").await?.is_none())
        })
        .await?;
        // The container may answer a little longer than its API object lives (the kubelet
        // stops it after the delete): ask until the answer changes, each ask bounded.
        let deadline = std::time::Instant::now() + Duration::from_secs(90);
        let e = loop {
            let e = tokio::time::timeout(
                Duration::from_secs(70),
                file_op(
                    &mut c,
                    "ts-1",
                    "acme",
                    "read_file",
                    json!({"path": "a.txt"}),
                ),
            )
            .await
            .context("no answer within 70 s for a deleted pod")??;
            if e.is_err() || std::time::Instant::now() > deadline {
                break e;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        };
        ensure!(
            e.as_ref()
                .is_err_and(|(code, _)| code == codes::AGENT_UNREACHABLE),
            "{e:?}"
        );
        Ok(())
    })
    .await;
}
