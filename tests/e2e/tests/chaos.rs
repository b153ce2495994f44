//! Chaos on the real test cluster (SECURITY-CASES.md, issue "proof under attack"): the API
//! server restarted under 50 runs and two sessions, the gateway killed during streams, a
//! warm pod and a session pod killed mid-run, the sandbox's deny-all NetworkPolicy deleted
//! and opened. Every caller gets a typed result, nothing runs twice, and what the cluster
//! lost is put back.
//!
//! Its own test binary: cargo runs test binaries one after another, so nothing else uses
//! the cluster while one of these breaks it; within the binary the tests take turns
//! ([`CHAOS`]). Shares the chart release of kubernetes.rs (`release/`).
//!
//! Run: `tests/cluster/up && eval "$(tests/cluster/env)" &&
//! TOOLRUN_REQUIRE_CLUSTER=1 cargo test -p toolrun-e2e --test chaos -- --nocapture`.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};
use toolrun_crd::ToolRun;
use toolrun_e2e::*;
use toolrun_proto::v1 as pb;
use toolrun_proto::v1::tool_service_client::ToolServiceClient;

mod release;
use release::*;

/// One chaos at a time.
static CHAOS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

type Grpc = ToolServiceClient<tonic::transport::Channel>;

/// How a call ended for its caller: a tool result (ok or a typed error code) or a gRPC
/// status (typed by its code).
#[derive(Debug)]
#[allow(dead_code)] // the messages are read through Debug, in failure messages
enum Ended {
    Ok(Value),
    Tool(pb::ErrorCode, String),
    Status(tonic::Code, String),
}

impl Ended {
    fn from(r: std::result::Result<tonic::Response<pb::CallToolResponse>, tonic::Status>) -> Self {
        match r {
            Err(s) => Ended::Status(s.code(), s.message().to_string()),
            Ok(resp) => match resp.into_inner().result {
                None => Ended::Status(tonic::Code::Internal, "no result".into()),
                Some(r) => match r.error {
                    Some(e) => Ended::Tool(
                        pb::ErrorCode::try_from(e.code).unwrap_or(pb::ErrorCode::Unspecified),
                        e.message,
                    ),
                    None => Ended::Ok(serde_json::from_str(&r.output_json).unwrap_or(Value::Null)),
                },
            },
        }
    }
    /// A code the caller can act on (retry, report), never a bare "unknown".
    fn is_typed(&self) -> bool {
        match self {
            Ended::Ok(_) => true,
            Ended::Tool(code, _) => *code != pb::ErrorCode::Unspecified,
            Ended::Status(code, _) => !matches!(code, tonic::Code::Unknown | tonic::Code::Ok),
        }
    }
}

fn call(tool: &str, session: &str, args: Value) -> (String, pb::CallToolRequest) {
    let call_id = unique(&format!("chaos-{tool}"));
    let req = pb::CallToolRequest {
        call_id: call_id.clone(),
        tool: tool.into(),
        arguments_json: args.to_string(),
        timeout_ms: 0,
        session_id: session.into(),
    };
    (call_id, req)
}

/// Runs `req` with a fresh connection, bounded by `limit` (a hang fails the test).
async fn ended(d: &Deployed, req: pb::CallToolRequest, limit: Duration) -> Ended {
    let id = req.call_id.clone();
    let run = async {
        match ToolServiceClient::connect(d.gateway.clone()).await {
            Ok(mut c) => Ended::from(c.call_tool(req).await),
            Err(e) => Ended::Status(tonic::Code::Unavailable, format!("connect: {e}")),
        }
    };
    tokio::time::timeout(limit, run)
        .await
        .unwrap_or_else(|_| panic!("call {id} had no answer within {limit:?}: a hang"))
}

/// Retries a call while the gateway itself is unreachable (a transport error: nothing was
/// sent, or its pod is restarting), as a client would.
async fn ended_retrying(d: &Deployed, req: pb::CallToolRequest, limit: Duration) -> Ended {
    let deadline = Instant::now() + limit;
    loop {
        let e = ended(d, req.clone(), limit).await;
        match &e {
            Ended::Status(tonic::Code::Unavailable, _) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(500)).await
            }
            _ => return e,
        }
    }
}

async fn new_session(d: &Deployed) -> String {
    create_session(&mut client(d).await).await
}

async fn close_session(d: &Deployed, sid: &str) {
    let mut c: Grpc = client(d).await;
    let _ = c
        .close_session(pb::CloseSessionRequest {
            session_id: sid.into(),
        })
        .await;
}

/// The lines of `log.txt` in session `sid`.
async fn session_log(d: &Deployed, sid: &str) -> Vec<String> {
    let (_, req) = call("read_file", sid, json!({"path": "log.txt"}));
    match ended_retrying(d, req, Duration::from_secs(120)).await {
        Ended::Ok(out) => out["content"]
            .as_str()
            .unwrap_or_default()
            .lines()
            // read_file numbers its lines: "     1\tcall 0".
            .map(|l| l.split_once('\t').map_or(l, |(_, text)| text).to_string())
            .collect(),
        other => panic!("read_file log.txt in {sid}: {other:?}"),
    }
}

async fn toolruns_of_call(runs: &Api<ToolRun>, call_id: &str) -> Vec<ToolRun> {
    runs.list(&ListParams::default().labels(&format!("toolrun.dev/call-id={call_id}")))
        .await
        .unwrap()
        .items
}

fn tally(ends: &[&Ended]) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for e in ends {
        let k = match e {
            Ended::Ok(_) => "ok".to_string(),
            Ended::Tool(c, _) => format!("{c:?}"),
            Ended::Status(c, _) => format!("grpc {c:?}"),
        };
        *m.entry(k).or_insert(0) += 1;
    }
    m
}

// ----------------------------------------------------------------- API server

/// The API server stops for 5 s and comes back (tests/cluster/restart) while 50 one-shot
/// runs and two sessions' runs are in flight. Every caller gets a typed result; no call
/// has two ToolRuns; every run that answered OK printed its own line; in each session the
/// workspace log holds exactly one line per OK answer (nothing lost, nothing run twice);
/// afterwards both sessions and a new run work (the cluster came back).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_api_server_restarting_under_50_runs_and_two_sessions_loses_and_repeats_nothing() {
    let Some(d) = deployed("chaos_api_server_restart") else {
        return;
    };
    let _chaos = CHAOS.lock().await;
    let kube = Client::try_default().await.unwrap();
    let runs: Api<ToolRun> = Api::namespaced(kube.clone(), SANDBOX_NS);
    let sessions = [new_session(&d).await, new_session(&d).await];

    let t0 = Instant::now();
    let mut one_shots = Vec::new();
    for i in 0..50 {
        let code = format!("import time\ntime.sleep(1)\nprint('run {i}')");
        let (id, req) = call("run_code", "", json!({"language": "python", "code": code}));
        let d = d.clone();
        one_shots.push((
            i,
            id,
            tokio::spawn(async move { ended(&d, req, Duration::from_secs(300)).await }),
        ));
    }
    let mut in_sessions = Vec::new();
    for sid in &sessions {
        let (d, sid) = (d.clone(), sid.clone());
        in_sessions.push(tokio::spawn(async move {
            let mut ends = Vec::new();
            for k in 0..6 {
                let code = format!(
                    "import time\nopen('log.txt', 'a').write('call {k}\\n')\ntime.sleep(1)\nprint('session call {k}')"
                );
                let (id, req) = call("run_code", &sid, json!({"language": "python", "code": code}));
                ends.push((k, id, ended(&d, req, Duration::from_secs(300)).await));
            }
            ends
        }));
    }
    // Let the calls get going, then take the API server away for 5 s.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let restart = tokio::task::spawn_blocking(|| {
        run_cmd(Command::new(repo().join("tests/cluster/restart")).args(["kube-apiserver", "5"]))
    })
    .await
    .unwrap()
    .expect("tests/cluster/restart kube-apiserver");
    eprintln!("{} (at {:?} into the calls)", restart.trim(), t0.elapsed());

    let mut ends = Vec::new();
    for (i, id, h) in one_shots {
        ends.push((i, id, h.await.unwrap()));
    }
    let session_ends: Vec<_> = futures::future::join_all(in_sessions)
        .await
        .into_iter()
        .map(|r| r.unwrap())
        .collect();
    let all: Vec<&Ended> = ends
        .iter()
        .map(|(_, _, e)| e)
        .chain(session_ends.iter().flatten().map(|(_, _, e)| e))
        .collect();
    eprintln!(
        "62 calls ended within {:?}: {:?}",
        t0.elapsed(),
        tally(&all)
    );
    for e in &all {
        assert!(e.is_typed(), "an untyped end: {e:?}");
    }
    // Each one-shot: at most one ToolRun, and an OK one printed its own line.
    for (i, id, e) in &ends {
        let trs = toolruns_of_call(&runs, id).await;
        assert!(trs.len() <= 1, "call {id}: {} ToolRuns", trs.len());
        if let Ended::Ok(out) = e {
            assert_eq!(out["stdout"], format!("run {i}\n"), "{id}: {out}");
            assert_eq!(trs.len(), 1, "an OK call {id} has its ToolRun");
        }
    }
    // Each session: one log line per OK answer, each call at most once.
    for (sid, ends) in sessions.iter().zip(&session_ends) {
        let log = session_log(&d, sid).await;
        let ok: Vec<String> = ends
            .iter()
            .filter(|(_, _, e)| matches!(e, Ended::Ok(_)))
            .map(|(k, _, _)| format!("call {k}"))
            .collect();
        let mut seen = std::collections::BTreeSet::new();
        for line in &log {
            assert!(
                seen.insert(line.clone()),
                "{sid}: '{line}' ran twice: {log:?}"
            );
        }
        for line in &ok {
            assert!(
                log.contains(line),
                "{sid}: OK '{line}' not in the log {log:?}"
            );
        }
        for (_, id, _) in ends {
            assert!(toolruns_of_call(&runs, id).await.len() <= 1, "{id}");
        }
    }
    // What did not run ended with a verdict a caller can act on: its time ran out while
    // the API server was away (queued calls wait within their own timeout), or the
    // infrastructure failed; never a bare error.
    for e in &all {
        match e {
            Ended::Ok(_) => {}
            Ended::Tool(code, _) => assert!(
                matches!(
                    code,
                    pb::ErrorCode::Timeout
                        | pb::ErrorCode::Unavailable
                        | pb::ErrorCode::ResourceExhausted
                ),
                "{e:?}"
            ),
            Ended::Status(code, _) => {
                assert_eq!(*code, tonic::Code::Unavailable, "{e:?}")
            }
        }
    }
    let oks = all.iter().filter(|e| matches!(e, Ended::Ok(_))).count();
    assert!(oks > 0, "no call rode out the outage: {:?}", tally(&all));
    // The cluster is back: the sessions and a new run work.
    for sid in &sessions {
        let (_, req) = call(
            "run_code",
            sid,
            json!({"language": "python", "code": "print(2)"}),
        );
        match ended_retrying(&d, req, Duration::from_secs(180)).await {
            Ended::Ok(out) => assert_eq!(out["stdout"], "2\n"),
            other => panic!("session {sid} after the restart: {other:?}"),
        }
        close_session(&d, sid).await;
    }
    let (_, req) = call(
        "run_code",
        "",
        json!({"language": "python", "code": "print(3)"}),
    );
    match ended_retrying(&d, req, Duration::from_secs(180)).await {
        Ended::Ok(out) => assert_eq!(out["stdout"], "3\n"),
        other => panic!("a run after the restart: {other:?}"),
    }
}

// ------------------------------------------------------------------- gateway

/// Every gateway pod is killed (no grace) while five StreamTool calls stream output. Each
/// stream ends for its caller with a typed gRPC status within seconds (no hang); the runs
/// themselves are the cluster's, not the gateway's: each ToolRun still finishes, its whole
/// output recorded, in one pod; the new gateway pod serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killing_the_gateway_during_streams_ends_each_stream_and_the_runs_finish() {
    let Some(d) = deployed("chaos_gateway_kill") else {
        return;
    };
    let _chaos = CHAOS.lock().await;
    let kube = Client::try_default().await.unwrap();
    let runs: Api<ToolRun> = Api::namespaced(kube.clone(), SANDBOX_NS);
    let system_pods: Api<Pod> = Api::namespaced(kube.clone(), SYSTEM_NS);
    let code =
        "import time\nfor i in range(12):\n    print('tick', i, flush=True)\n    time.sleep(1)";
    let (first_tx, mut first_rx) = tokio::sync::mpsc::channel::<()>(8);
    let mut streams = Vec::new();
    for _ in 0..5 {
        let (id, req) = call(
            "run_code",
            "",
            json!({"language": "python", "code": code, "timeout": 30}),
        );
        let (d, first_tx) = (d.clone(), first_tx.clone());
        streams.push((
            id,
            tokio::spawn(async move {
                let mut c: Grpc = client(&d).await;
                let mut s = c.stream_tool(req).await.expect("StreamTool").into_inner();
                let mut told = false;
                loop {
                    match s.next().await {
                        None => return (Instant::now(), Err((tonic::Code::Ok, String::new()))),
                        Some(Err(status)) => {
                            return (
                                Instant::now(),
                                Err((status.code(), status.message().to_string())),
                            );
                        }
                        Some(Ok(ev)) => match ev.event {
                            Some(pb::tool_event::Event::Stdout(_)) if !told => {
                                told = true;
                                let _ = first_tx.send(()).await;
                            }
                            Some(pb::tool_event::Event::Result(r)) => {
                                return (Instant::now(), Ok(r));
                            }
                            _ => {}
                        },
                    }
                }
            }),
        ));
    }
    drop(first_tx);
    // Every stream has output: the programs run.
    for _ in 0..5 {
        tokio::time::timeout(Duration::from_secs(120), first_rx.recv())
            .await
            .expect("each stream's first output within 120 s");
    }
    let killed_at = Instant::now();
    let (gateways, killed) = kill_component_pods(&system_pods, "gateway").await;
    for (id, h) in streams {
        let (at, end) = tokio::time::timeout(Duration::from_secs(60), h)
            .await
            .unwrap_or_else(|_| panic!("stream {id} still open 60 s after the gateway died"))
            .unwrap();
        eprintln!("stream {id}: {end:?} {:?} after the kill", at - killed_at);
        match end {
            // The connection is gone: tonic reports a reset stream as Unavailable, or as
            // Unknown naming the transport (an h2 or body error): either tells the caller
            // the gateway went away, not that the tool failed.
            Err((code, message)) => assert!(
                matches!(code, tonic::Code::Unavailable | tonic::Code::Cancelled)
                    || (code == tonic::Code::Unknown
                        && ["transport", "h2", "connection", "body", "stream"]
                            .iter()
                            .any(|w| message.contains(w))),
                "{id}: {code:?} {message}"
            ),
            // A stream that finished just before the kill reached it.
            Ok(r) => assert!(r.ok, "{id}: {r:?}"),
        }
        // The run goes on without the gateway and is recorded whole, once.
        let trs = toolruns_of_call(&runs, &id).await;
        assert_eq!(trs.len(), 1, "{id}: one ToolRun");
        let name = trs[0].name_any();
        wait_finished(&runs, &name, Duration::from_secs(120)).await;
        let st = runs.get(&name).await.unwrap().status.unwrap();
        let want: String = (0..12).map(|i| format!("tick {i}\n")).collect();
        assert_eq!(st.stdout.as_deref(), Some(want.as_str()), "{name}: {st:?}");
        assert_eq!(st.phase, Some(toolrun_crd::Phase::Succeeded), "{name}");
    }
    // A new gateway pod serves.
    let (_, req) = call(
        "run_code",
        "",
        json!({"language": "python", "code": "print(4)"}),
    );
    match ended_retrying(&d, req, Duration::from_secs(180)).await {
        Ended::Ok(out) => assert_eq!(out["stdout"], "4\n"),
        other => panic!("a run through the new gateway pod: {other:?}"),
    }
    let replacement = system_pods.list(&gateways).await.unwrap().items;
    assert!(
        replacement.iter().all(|p| !killed.contains(&p.name_any())),
        "the killed pods are gone"
    );
}

// --------------------------------------------------------- pods killed mid-run

/// A warm pod killed while its run prints: the caller gets a typed result (not OK), the
/// ToolRun fails naming the lost pod, and no other pod runs it again. A session pod killed
/// mid-run: the call ends typed, the session is reported Failed (an emptyDir workspace),
/// and later calls in it are refused with a typed error.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_warm_pod_and_a_session_pod_killed_mid_run_give_typed_results_and_run_nothing_twice() {
    let Some(d) = deployed("chaos_pods_killed") else {
        return;
    };
    let _chaos = CHAOS.lock().await;
    let kube = Client::try_default().await.unwrap();
    let runs: Api<ToolRun> = Api::namespaced(kube.clone(), SANDBOX_NS);
    let pods: Api<Pod> = Api::namespaced(kube.clone(), SANDBOX_NS);
    let now = DeleteParams {
        grace_period_seconds: Some(0),
        ..DeleteParams::default()
    };
    let code =
        "import time\nfor i in range(20):\n    print('tick', i, flush=True)\n    time.sleep(1)";

    // 1. A one-shot run on a warm pod (the chart keeps python warm pods).
    wait_until(Duration::from_secs(180), "a ready python warm pod", || {
        let pods = pods.clone();
        async move {
            let lp = ListParams::default().labels("toolrun.dev/warm-pool=python");
            Ok(pods
                .list(&lp)
                .await?
                .items
                .iter()
                .any(|p| p.owner_references().is_empty() && is_ready(p)))
        }
    })
    .await
    .unwrap();
    let (id, req) = call("run_code", "", json!({"language": "python", "code": code}));
    let pending = {
        let d = d.clone();
        tokio::spawn(async move { ended_retrying(&d, req, Duration::from_secs(180)).await })
    };
    // The run starts in its pod.
    let deadline = Instant::now() + Duration::from_secs(60);
    let (run_name, pod_name) = loop {
        let trs = toolruns_of_call(&runs, &id).await;
        let st = trs
            .first()
            .and_then(|t| t.status.clone())
            .unwrap_or_default();
        if st.phase == Some(toolrun_crd::Phase::Running)
            && let Some(pod) = st.pod_name
        {
            break (trs[0].name_any(), pod);
        }
        assert!(Instant::now() < deadline, "run {id} not running after 60 s");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let pod = pods.get(&pod_name).await.unwrap();
    let warm =
        pod.labels().contains_key("toolrun.dev/warm-pool") || !pod_name.starts_with(&run_name);
    eprintln!("run {run_name} in pod {pod_name} (warm: {warm})");
    assert!(warm, "the run took a warm pod ({pod_name})");
    tokio::time::sleep(Duration::from_secs(2)).await;
    pods.delete(&pod_name, &now).await.unwrap();
    let e = tokio::time::timeout(Duration::from_secs(150), pending)
        .await
        .expect("the caller's answer")
        .unwrap();
    eprintln!("warm pod killed mid-run: {e:?}");
    assert!(e.is_typed() && !matches!(e, Ended::Ok(_)), "{e:?}");
    wait_finished(&runs, &run_name, Duration::from_secs(120)).await;
    let tr = runs.get(&run_name).await.unwrap();
    let st = tr.status.clone().unwrap();
    assert_eq!(st.phase, Some(toolrun_crd::Phase::Failed), "{st:?}");
    assert_eq!(
        st.pod_name.as_deref(),
        Some(pod_name.as_str()),
        "never moved to another pod"
    );
    // No other pod ever ran it: none carries its name or its call.
    let others: Vec<String> = pods
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .filter(|p| p.name_any() != pod_name)
        .filter(|p| {
            p.name_any().starts_with(&run_name)
                || p.labels().get("toolrun.dev/call-id") == Some(&id)
                || p.owner_references().iter().any(|o| o.name == run_name)
        })
        .map(|p| p.name_any())
        .collect();
    assert!(others.is_empty(), "a second pod for {run_name}: {others:?}");

    // 2. A session pod, mid-run.
    let sid = new_session(&d).await;
    let (_, req) = call(
        "run_code",
        &sid,
        json!({"language": "python", "code": format!("open('log.txt', 'a').write('once\\n')\n{code}")}),
    );
    let pending = {
        let d = d.clone();
        tokio::spawn(async move { ended_retrying(&d, req, Duration::from_secs(180)).await })
    };
    let lp = ListParams::default().labels(&format!("toolrun.dev/session-id={sid}"));
    let sessions: Api<toolrun_crd::ToolSession> = Api::namespaced(kube.clone(), SANDBOX_NS);
    let ts = sessions.list(&lp).await.unwrap().items.remove(0);
    let session_pod = ts
        .status
        .as_ref()
        .and_then(|s| s.pod_name.clone())
        .expect("session pod");
    tokio::time::sleep(Duration::from_secs(4)).await;
    pods.delete(&session_pod, &now).await.unwrap();
    let e = tokio::time::timeout(Duration::from_secs(150), pending)
        .await
        .expect("the caller's answer")
        .unwrap();
    eprintln!("session pod killed mid-run: {e:?}");
    assert!(e.is_typed() && !matches!(e, Ended::Ok(_)), "{e:?}");
    wait_until(
        Duration::from_secs(60),
        "the session to be reported Failed",
        || {
            let (sessions, name) = (sessions.clone(), ts.name_any());
            async move {
                let ts = sessions.get(&name).await?;
                Ok(ts.status.and_then(|s| s.phase)
                    == Some(toolrun_crd::session::SessionPhase::Failed))
            }
        },
    )
    .await
    .unwrap();
    let (_, req) = call("read_file", &sid, json!({"path": "log.txt"}));
    let after = ended(&d, req, Duration::from_secs(60)).await;
    eprintln!("a call in the failed session: {after:?}");
    assert!(
        after.is_typed() && !matches!(after, Ended::Ok(_)),
        "{after:?}"
    );
    close_session(&d, &sid).await;
}

// ------------------------------------------------------------ NetworkPolicy

/// The sum of `toolrun_operator_network_policy_restored_total` over the operator pods.
async fn restored_total(kube: &Client) -> f64 {
    let system_pods: Api<Pod> = Api::namespaced(kube.clone(), SYSTEM_NS);
    let lp = ListParams::default().labels("app.kubernetes.io/component=operator");
    let mut sum = 0.0;
    for p in system_pods.list(&lp).await.unwrap().items {
        let Some(ip) = p.status.and_then(|s| s.pod_ip) else {
            continue;
        };
        let Ok(text) = run_cmd(Command::new("curl").args([
            "-fsS",
            "--max-time",
            "5",
            &format!("http://{ip}:9090/metrics"),
        ])) else {
            continue;
        };
        sum += text
            .lines()
            .filter(|l| l.starts_with("toolrun_operator_network_policy_restored_total"))
            .filter_map(|l| l.split_whitespace().last()?.parse::<f64>().ok())
            .sum::<f64>();
    }
    sum
}

/// The deny-all NetworkPolicy of the sandbox namespace, deleted and then opened to all
/// ingress, is put back by the operator within seconds, each counted once; a label added
/// to it (control: not a change of what it enforces) is left alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_or_opened_deny_all_policy_is_restored() {
    let Some(_d) = deployed("chaos_network_policy") else {
        return;
    };
    let _chaos = CHAOS.lock().await;
    let kube = Client::try_default().await.unwrap();
    let policies: Api<NetworkPolicy> = Api::namespaced(kube.clone(), SANDBOX_NS);
    const NAME: &str = "toolrun-sandbox-deny-all";
    let before = policies.get(NAME).await.expect("the deny-all policy");
    let base = restored_total(&kube).await;

    // Control: a label is not a change of the policy.
    policies
        .patch(
            NAME,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"chaos-test": "x"}}})),
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(restored_total(&kube).await, base, "a label is left alone");

    // Deleted: back with a new uid.
    let t = Instant::now();
    policies
        .delete(NAME, &DeleteParams::default())
        .await
        .unwrap();
    let old_uid = before.uid();
    wait_until(
        Duration::from_secs(10),
        "the deny-all policy to be back",
        || {
            let (policies, old_uid) = (policies.clone(), old_uid.clone());
            async move {
                Ok(policies
                    .get_opt(NAME)
                    .await?
                    .is_some_and(|p| p.uid() != old_uid && p.metadata.deletion_timestamp.is_none()))
            }
        },
    )
    .await
    .unwrap();
    eprintln!("deleted deny-all policy back after {:?}", t.elapsed());
    let restored = policies.get(NAME).await.unwrap();
    assert_eq!(restored.spec, before.spec, "the same rules");

    // Opened to every ingress: closed again.
    let t = Instant::now();
    policies
        .patch(
            NAME,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"ingress": [{}]}})),
        )
        .await
        .unwrap();
    wait_until(
        Duration::from_secs(10),
        "the policy to be closed again",
        || {
            let policies = policies.clone();
            async move {
                let p = policies.get(NAME).await?;
                Ok(p.spec.and_then(|s| s.ingress).is_none_or(|i| i.is_empty()))
            }
        },
    )
    .await
    .unwrap();
    eprintln!("opened deny-all policy closed after {:?}", t.elapsed());
    wait_until(Duration::from_secs(10), "two restorations counted", || {
        let kube = kube.clone();
        async move { Ok(restored_total(&kube).await >= base + 2.0) }
    })
    .await
    .unwrap();
    assert_eq!(restored_total(&kube).await, base + 2.0, "each counted once");
}

/// A session pod whose sandbox label (what the deny-all policy selects) is removed gets it
/// back from the operator, with a Warning event on the session. What a run in the session
/// says after it depends on who was faster, the operator or the policy controller: it may
/// run (the label was back first) or end INFRA_ERROR (the agent saw the pod open and now
/// refuses every run); it never runs with the network.
#[tokio::test]
async fn a_session_pod_stripped_of_its_sandbox_label_gets_it_back() {
    let Some(d) = deployed("chaos_session_label") else {
        return;
    };
    let _chaos = CHAOS.lock().await;
    let kube = Client::try_default().await.unwrap();
    let pods: Api<Pod> = Api::namespaced(kube.clone(), SANDBOX_NS);
    let sessions: Api<toolrun_crd::ToolSession> = Api::namespaced(kube.clone(), SANDBOX_NS);
    let sid = new_session(&d).await;
    let lp = ListParams::default().labels(&format!("toolrun.dev/session-id={sid}"));
    let ts = sessions.list(&lp).await.unwrap().items.remove(0);
    let pod = ts
        .status
        .as_ref()
        .and_then(|s| s.pod_name.clone())
        .expect("session pod");
    let label = |p: &Pod| p.labels().get("toolrun.dev/sandbox").cloned();
    assert_eq!(
        label(&pods.get(&pod).await.unwrap()).as_deref(),
        Some("true")
    );
    let t = Instant::now();
    pods.patch(
        &pod,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"toolrun.dev/sandbox": null}}})),
    )
    .await
    .unwrap();
    wait_until(Duration::from_secs(20), "the sandbox label back", || {
        let (pods, pod) = (pods.clone(), pod.clone());
        async move { Ok(label(&pods.get(&pod).await?).as_deref() == Some("true")) }
    })
    .await
    .unwrap();
    eprintln!("sandbox label back after {:?}", t.elapsed());
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(kube.clone(), SANDBOX_NS);
    wait_until(Duration::from_secs(20), "an Isolated event", || {
        let (events, name) = (events.clone(), ts.name_any());
        async move {
            let lp = ListParams::default().fields(&format!("involvedObject.name={name}"));
            Ok(events
                .list(&lp)
                .await?
                .items
                .iter()
                .any(|e| e.reason.as_deref() == Some("Isolated")))
        }
    })
    .await
    .unwrap();
    // Whatever the race, nothing reaches the API server from the session (dropped: a
    // timeout).
    let probe = format!(
        "import socket\ntry:\n    socket.create_connection(('{}', 443), timeout=2)\n    print('CONNECTED')\nexcept OSError as e:\n    print('BLOCKED', type(e).__name__)",
        d.apiserver_ip
    );
    let (_, req) = call(
        "run_code",
        &sid,
        json!({"language": "python", "code": probe}),
    );
    let after = ended(&d, req, Duration::from_secs(60)).await;
    eprintln!("a run after the label came back: {after:?}");
    match &after {
        Ended::Ok(v) => assert!(
            v["stdout"]
                .as_str()
                .unwrap_or_default()
                .starts_with("BLOCKED"),
            "{after:?}"
        ),
        Ended::Tool(pb::ErrorCode::Unavailable, m) => {
            assert!(m.contains("reachable from the sandbox"), "{m}")
        }
        other => panic!("{other:?}"),
    }
    close_session(&d, &sid).await;
}
