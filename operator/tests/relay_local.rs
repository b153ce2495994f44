//! The relay against a REAL agent: `toolrun-runner agent` started here with piped stdin and
//! stdout (standing for a pod's attach stream), its real file-access core answering. No
//! cluster: the Kubernetes parts (ToolSession lookup, pods/attach) are the only things
//! replaced, by tables (`TableSessions`, `TableAgents`).
//!
//! Needs `target/<profile>/toolrun-runner` (`cargo build -p toolrun-runner`).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::process::{Child, Command};
use toolrun_operator::relay::Connection;
use toolrun_operator::session::relay_server::{
    RelayService, SessionTarget, TableAgents, TableSessions, codes, serve,
};
use toolrun_proto::relay::session_relay_client::SessionRelayClient;
use toolrun_proto::relay::{FileOpRequest, file_op_reply};
use toolrun_runner::agent::proto::{Body, Op, Request};
use toolrun_runner::{Language, RunSpec, RunnerLimits};

const TOKEN: &str = "test-relay-token-0123456789abcdef";

fn runner() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().parent().unwrap();
    let p = dir.join("toolrun-runner");
    assert!(
        p.is_file(),
        "{} is missing: cargo build -p toolrun-runner",
        p.display()
    );
    p
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "relay-{name}-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A real agent serving `workspace`, and a connection over its pipes.
fn agent(workspace: &Path) -> (Child, Connection) {
    let mut child = Command::new(runner())
        .args(["agent", "--require-unreachable", "off", "--workspace"])
        .arg(workspace)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let stdin = child.stdin.take().unwrap();
    let stdout = child.stdout.take().unwrap();
    (child, Connection::over("local-agent", stdin, stdout))
}

fn file_op(id: &str, op: &str, args: Value) -> Request {
    serde_json::from_value(json!({"id": id, "op": op, "args": args})).unwrap()
}

fn run_spec(code: &str, workdir: &Path) -> RunSpec {
    RunSpec {
        language: Language::Bash,
        code: code.into(),
        args: vec![],
        env: [("PATH".to_string(), "/usr/bin:/bin".to_string())].into(),
        stdin: String::new(),
        interpreter: "/bin/bash".into(),
        workdir: workdir.display().to_string(),
        setup: Default::default(),
        limits: RunnerLimits {
            timeout_ms: 20_000,
            output_limit_bytes: 1 << 20,
            cpu_seconds: 0,
            max_processes: 0,
            max_file_bytes: 0,
            max_open_files: 0,
            address_space_bytes: 0,
        },
    }
}

fn ok_output(r: &toolrun_runner::agent::proto::Response) -> &Value {
    match &r.body {
        Body::Ok { output } => output,
        other => panic!("not ok: {other:?}"),
    }
}

#[tokio::test]
async fn concurrent_file_ops_and_a_run_share_one_connection() {
    let ws = temp_dir("concurrent");
    let (_child, conn) = agent(&ws);
    // A run that streams while file ops come and go beside it on the same stream.
    let run = {
        let conn = conn.clone();
        let ws = ws.clone();
        tokio::spawn(async move {
            let mut streamed = String::new();
            let done = conn
                .call(
                    Request {
                        id: "run-1".into(),
                        op: Op::Run {
                            spec: Box::new(run_spec(
                                "for i in $(seq 1 10); do echo tick-$i; sleep 0.2; done; cat f-7.txt",
                                &ws,
                            )),
                        },
                    },
                    |r| {
                        if let Body::Stdout { data } = &r.body {
                            streamed.push_str(data);
                        }
                    },
                )
                .await
                .unwrap();
            (streamed, done)
        })
    };
    let started = Instant::now();
    let writes = (0..24).map(|i| {
        let conn = conn.clone();
        async move {
            let args = json!({"path": format!("f-{i}.txt"), "content": format!("content {i}\n")});
            conn.call(file_op(&format!("w-{i}"), "write_file", args), |_| {})
                .await
                .unwrap()
        }
    });
    for (i, r) in futures::future::join_all(writes).await.iter().enumerate() {
        assert_eq!(ok_output(r)["path"], format!("f-{i}.txt"), "{r:?}");
    }
    let reads = (0..24).map(|i| {
        let conn = conn.clone();
        async move {
            let args = json!({"path": format!("f-{i}.txt")});
            conn.call(file_op(&format!("r-{i}"), "read_file", args), |_| {})
                .await
                .unwrap()
        }
    });
    for (i, r) in futures::future::join_all(reads).await.iter().enumerate() {
        let content = ok_output(r)["content"].as_str().unwrap();
        assert!(content.contains(&format!("content {i}")), "{content:?}");
    }
    // The file ops did not wait for the run (two seconds): they were answered beside it.
    let file_ops_took = started.elapsed();
    assert!(
        !run.is_finished(),
        "48 file ops took {file_ops_took:?}, longer than the run: they waited for it"
    );
    let (streamed, done) = run.await.unwrap();
    let Body::Result(record) = done.body else {
        panic!("not a result: {done:?}");
    };
    let ticks: String = (1..=10).map(|i| format!("tick-{i}\n")).collect();
    assert_eq!(record.stdout, format!("{ticks}content 7\n"));
    assert_eq!(
        streamed, record.stdout,
        "every chunk streamed once, in order"
    );
    assert_eq!(conn.calls_in_flight(), 0, "no route left behind");
}

#[tokio::test]
async fn a_dead_agent_is_a_typed_error_not_a_hang() {
    let ws = temp_dir("dead");
    let (mut child, conn) = agent(&ws);
    // Control: it answers while alive.
    let r = conn
        .call(
            file_op("w-1", "write_file", json!({"path": "a", "content": "x"})),
            |_| {},
        )
        .await
        .unwrap();
    ok_output(&r);
    // A call in flight when the agent dies, and one after.
    let slow = {
        let conn = conn.clone();
        let ws = ws.clone();
        tokio::spawn(async move {
            conn.call_with(
                Request {
                    id: "run-long".into(),
                    op: Op::Run {
                        spec: Box::new(run_spec("sleep 30", &ws)),
                    },
                },
                |_| {},
                2,
            )
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    child.kill().await.unwrap();
    let t = Instant::now();
    let err = tokio::time::timeout(Duration::from_secs(10), slow)
        .await
        .expect("the call in flight hung after the agent died")
        .unwrap()
        .unwrap_err();
    assert!(err.to_string().contains("unreachable"), "{err}");
    let err = tokio::time::timeout(
        Duration::from_secs(10),
        conn.call_with(file_op("r-1", "read_file", json!({"path": "a"})), |_| {}, 2),
    )
    .await
    .expect("a call after the agent died hung")
    .unwrap_err();
    assert!(err.to_string().contains("unreachable"), "{err}");
    assert!(t.elapsed() < Duration::from_secs(10));
}

/// A relay server in process, over one local agent serving session `ts-a` of tenant `acme`.
struct Relay {
    addr: std::net::SocketAddr,
    sessions: Arc<TableSessions>,
    child: Child,
    _stop: tokio_util::sync::DropGuard,
}

async fn relay(call_timeout: Duration) -> Relay {
    let ws = temp_dir("relay");
    let (child, conn) = agent(&ws);
    let sessions = Arc::new(TableSessions::default());
    sessions.set(
        "ts-a",
        SessionTarget {
            tenant: "acme".into(),
            pod: Some("pod-a".into()),
            state: "phase Ready".into(),
        },
    );
    sessions.set(
        "ts-pending",
        SessionTarget {
            tenant: "acme".into(),
            pod: None,
            state: "phase Pending: waiting for the pod".into(),
        },
    );
    let agents = Arc::new(TableAgents::default());
    agents.set("pod-a", conn);
    let service = RelayService::new(TOKEN.into(), sessions.clone(), agents, call_timeout)
        .with_max_attempts(2);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    tokio::spawn(serve(listener, service, stop.clone()));
    Relay {
        addr,
        sessions,
        child,
        _stop: stop.drop_guard(),
    }
}

type Client = SessionRelayClient<tonic::transport::Channel>;

async fn client(addr: std::net::SocketAddr) -> Client {
    SessionRelayClient::connect(format!("http://{addr}"))
        .await
        .unwrap()
}

/// One FileOp: Ok(result JSON) or Err((code, message)); a gRPC status is a panic.
async fn call(
    c: &mut Client,
    token: Option<&str>,
    session: &str,
    tenant: &str,
    op: &str,
    args: Value,
) -> Result<Result<Value, (String, String)>, tonic::Status> {
    let mut req = tonic::Request::new(FileOpRequest {
        session: session.into(),
        tenant: tenant.into(),
        request_id: uuid_like(),
        op: op.into(),
        args_json: args.to_string(),
    });
    if let Some(t) = token {
        req.metadata_mut()
            .insert("authorization", format!("Bearer {t}").parse().unwrap());
    }
    let reply = c.file_op(req).await?.into_inner();
    Ok(match reply.outcome.unwrap() {
        file_op_reply::Outcome::ResultJson(j) => Ok(serde_json::from_str(&j).unwrap()),
        file_op_reply::Outcome::Error(e) => Err((e.code, e.message)),
    })
}

fn uuid_like() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        "req-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

#[tokio::test]
async fn the_relay_serves_file_ops_with_the_cores_answers_and_codes() {
    let r = relay(Duration::from_secs(20)).await;
    let mut c = client(r.addr).await;
    let ok = |v: Result<Result<Value, (String, String)>, tonic::Status>| v.unwrap().unwrap();
    let code =
        |v: Result<Result<Value, (String, String)>, tonic::Status>| v.unwrap().unwrap_err().0;

    let w = ok(call(
        &mut c,
        Some(TOKEN),
        "ts-a",
        "acme",
        "write_file",
        json!({"path": "src/main.py", "content": "print('hi')\n", "createDirs": true}),
    )
    .await);
    assert_eq!(w["created"], true, "{w}");
    let read = ok(call(
        &mut c,
        Some(TOKEN),
        "ts-a",
        "acme",
        "read_file",
        json!({"path": "src/main.py"}),
    )
    .await);
    assert_eq!(read["content"], "     1\tprint('hi')\n", "{read}");
    assert_eq!(read["totalLines"], 1);
    let grep = ok(call(
        &mut c,
        Some(TOKEN),
        "ts-a",
        "acme",
        "grep",
        json!({"pattern": "print"}),
    )
    .await);
    assert_eq!(grep["matches"][0]["path"], "src/main.py", "{grep}");
    let preview = ok(call(
        &mut c,
        Some(TOKEN),
        "ts-a",
        "acme",
        "preview_edit",
        json!({"path": "src/main.py", "old_string": "hi", "new_string": "there"}),
    )
    .await);
    assert!(
        preview["diff"]
            .as_str()
            .unwrap()
            .contains("+print('there')"),
        "{preview}"
    );
    // The preview changed nothing.
    let again = ok(call(
        &mut c,
        Some(TOKEN),
        "ts-a",
        "acme",
        "read_file",
        json!({"path": "src/main.py"}),
    )
    .await);
    assert_eq!(again["content"], read["content"]);
    // The workspace's usage (GetSession on kubernetes): the agent's walk, passed through.
    let usage = ok(call(&mut c, Some(TOKEN), "ts-a", "acme", "usage", json!({})).await);
    assert_eq!(usage["filesUsed"], 3, "root, src, main.py: {usage}");
    assert!(usage["bytesUsed"].as_u64().unwrap() > 0, "{usage}");
    assert!(usage["bytesLimit"].as_u64().unwrap() > 0, "{usage}");
    assert_eq!(usage["truncated"], false, "{usage}");

    // The core's typed errors, unchanged.
    let cases = [
        (
            "read_file",
            json!({"path": "missing.txt"}),
            "FILE_NOT_FOUND",
        ),
        (
            "read_file",
            json!({"path": "../../etc/passwd"}),
            "INVALID_PATH",
        ),
        ("read_file", json!({"path": "/etc/passwd"}), "INVALID_PATH"),
        (
            "edit",
            json!({"path": "src/main.py", "old_string": "absent", "new_string": "x"}),
            "NO_MATCH",
        ),
        (
            "move_file",
            json!({"from": "src/main.py", "to": "src"}),
            "ALREADY_EXISTS",
        ),
        ("read_file", json!({"nopath": 1}), "INVALID_ARGUMENTS"),
        ("usage", json!({"path": "."}), "INVALID_ARGUMENTS"),
    ];
    for (op, args, want) in cases {
        let got = code(call(&mut c, Some(TOKEN), "ts-a", "acme", op, args.clone()).await);
        assert_eq!(got, want, "{op} {args}");
    }
    // Only file ops pass: a run (or kill, status) is refused before reaching the agent.
    for op in ["run", "kill", "status", "nonsense"] {
        let got = code(call(&mut c, Some(TOKEN), "ts-a", "acme", op, json!({})).await);
        assert_eq!(got, codes::UNKNOWN_OP, "{op}");
    }
}

#[tokio::test]
async fn the_relay_refuses_bad_tokens_other_tenants_and_unknown_sessions() {
    let r = relay(Duration::from_secs(20)).await;
    let mut c = client(r.addr).await;
    let args = json!({"path": "."});
    // Control: the right token, tenant and session.
    call(
        &mut c,
        Some(TOKEN),
        "ts-a",
        "acme",
        "list_directory",
        args.clone(),
    )
    .await
    .unwrap()
    .unwrap();
    for token in [None, Some("wrong-token-0123456789abcdef"), Some("")] {
        let status = call(
            &mut c,
            token,
            "ts-a",
            "acme",
            "list_directory",
            args.clone(),
        )
        .await
        .unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unauthenticated, "{token:?}");
    }
    // Another tenant's session does not exist for the caller (same answer as an unknown one).
    let (code, other) = call(
        &mut c,
        Some(TOKEN),
        "ts-a",
        "other",
        "list_directory",
        args.clone(),
    )
    .await
    .unwrap()
    .unwrap_err();
    assert_eq!(code, codes::SESSION_NOT_FOUND);
    let (code, unknown) = call(
        &mut c,
        Some(TOKEN),
        "ts-nope",
        "acme",
        "list_directory",
        args.clone(),
    )
    .await
    .unwrap()
    .unwrap_err();
    assert_eq!(code, codes::SESSION_NOT_FOUND);
    assert_eq!(other.replace("ts-a", "X"), unknown.replace("ts-nope", "X"));
    let (code, message) = call(
        &mut c,
        Some(TOKEN),
        "ts-pending",
        "acme",
        "list_directory",
        args.clone(),
    )
    .await
    .unwrap()
    .unwrap_err();
    assert_eq!(code, codes::SESSION_NOT_READY);
    assert!(message.contains("waiting for the pod"), "{message}");
    // A session removed (closed) is gone at once.
    r.sessions.remove("ts-a");
    let (code, _) = call(&mut c, Some(TOKEN), "ts-a", "acme", "list_directory", args)
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(code, codes::SESSION_NOT_FOUND);
}

#[tokio::test]
async fn a_dead_or_stuck_agent_is_agent_unreachable_within_bounds() {
    // Stuck: the agent is stopped (SIGSTOP): no answer, the call bound ends the call.
    let r = relay(Duration::from_secs(2)).await;
    let mut c = client(r.addr).await;
    let pid = r.child.id().unwrap() as i32;
    call(
        &mut c,
        Some(TOKEN),
        "ts-a",
        "acme",
        "list_directory",
        json!({"path": "."}),
    )
    .await
    .unwrap()
    .unwrap();
    nix_kill(pid, "STOP");
    let t = Instant::now();
    let (code, message) = tokio::time::timeout(
        Duration::from_secs(10),
        call(
            &mut c,
            Some(TOKEN),
            "ts-a",
            "acme",
            "list_directory",
            json!({"path": "."}),
        ),
    )
    .await
    .expect("hung")
    .unwrap()
    .unwrap_err();
    assert_eq!(code, codes::AGENT_UNREACHABLE, "{message}");
    assert!(message.contains("did not answer within"), "{message}");
    assert!(t.elapsed() >= Duration::from_secs(2) && t.elapsed() < Duration::from_secs(6));
    // Resumed, it answers again on the same connection.
    nix_kill(pid, "CONT");
    call(
        &mut c,
        Some(TOKEN),
        "ts-a",
        "acme",
        "list_directory",
        json!({"path": "."}),
    )
    .await
    .unwrap()
    .unwrap();

    // Dead: the process is gone, the stream ends, no reattach is possible.
    nix_kill(pid, "KILL");
    let (code, message) = tokio::time::timeout(
        Duration::from_secs(10),
        call(
            &mut c,
            Some(TOKEN),
            "ts-a",
            "acme",
            "read_file",
            json!({"path": "x"}),
        ),
    )
    .await
    .expect("hung")
    .unwrap()
    .unwrap_err();
    assert_eq!(code, codes::AGENT_UNREACHABLE, "{message}");
    assert!(message.contains("unreachable"), "{message}");
}

fn nix_kill(pid: i32, sig: &str) {
    let status = std::process::Command::new("kill")
        .args([format!("-{sig}"), pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

/// A dropped stream is reopened and every call in flight is sent again on the new one: the
/// agent's stdin and stdout are FIFOs here, as the container runtime's are behind
/// `pods/attach`, so a new "attach" reaches the same running agent. The run streams every
/// line exactly once and runs once; file ops beside it are answered.
#[tokio::test]
async fn a_dropped_stream_is_reattached_and_calls_in_flight_finish_once() {
    use std::sync::atomic::{AtomicU32, Ordering};
    let dir = temp_dir("fifo");
    let (fin, fout) = (dir.join("in"), dir.join("out"));
    for p in [&fin, &fout] {
        assert!(
            std::process::Command::new("mkfifo")
                .arg(p)
                .status()
                .unwrap()
                .success()
        );
    }
    // The agent's ends: stdin read end (opened without waiting for a writer), stdout write
    // end (a reader must exist while it opens: ours, dropped at once).
    let agent_in = tokio::net::unix::pipe::OpenOptions::new()
        .open_receiver(&fin)
        .unwrap()
        .into_blocking_fd()
        .unwrap();
    let first_reader = tokio::net::unix::pipe::OpenOptions::new()
        .open_receiver(&fout)
        .unwrap();
    let agent_out = std::fs::OpenOptions::new().write(true).open(&fout).unwrap();
    drop(first_reader);
    let ws = temp_dir("fifo-ws");
    let _child = Command::new(runner())
        .args(["agent", "--require-unreachable", "off", "--workspace"])
        .arg(&ws)
        .stdin(Stdio::from(agent_in))
        .stdout(Stdio::from(agent_out))
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let opens = Arc::new(AtomicU32::new(0));
    let conn = {
        let (fin, fout, opens) = (fin.clone(), fout.clone(), opens.clone());
        Connection::lazy(
            "fifo-agent",
            Arc::new(move || {
                let (fin, fout, opens) = (fin.clone(), fout.clone(), opens.clone());
                Box::pin(async move {
                    opens.fetch_add(1, Ordering::SeqCst);
                    let stdout = tokio::net::unix::pipe::OpenOptions::new()
                        .open_receiver(&fout)
                        .map_err(|e| unreachable_err(e.to_string()))?;
                    let stdin = tokio::net::unix::pipe::OpenOptions::new()
                        .open_sender(&fin)
                        .map_err(|e| unreachable_err(e.to_string()))?;
                    Ok(toolrun_operator::relay::Streams {
                        stdin: Box::new(stdin),
                        stdout: Box::new(stdout),
                        keep: None,
                    })
                })
            }),
        )
    };
    let run = {
        let (conn, ws) = (conn.clone(), ws.clone());
        tokio::spawn(async move {
            let mut streamed = String::new();
            let done = conn
                .call(
                    Request {
                        id: "run-fifo".into(),
                        op: Op::Run {
                            spec: Box::new(run_spec(
                                "for i in $(seq 1 10); do echo line-$i; sleep 0.1; done; date +%s%N",
                                &ws,
                            )),
                        },
                    },
                    |r| {
                        if let Body::Stdout { data } = &r.body {
                            streamed.push_str(data);
                        }
                    },
                )
                .await
                .unwrap();
            (streamed, done)
        })
    };
    let w = conn
        .call(
            file_op(
                "w-a",
                "write_file",
                json!({"path": "a.txt", "content": "A"}),
            ),
            |_| {},
        )
        .await
        .unwrap();
    ok_output(&w);
    tokio::time::sleep(Duration::from_millis(450)).await;
    conn.drop_stream().await;
    // A file op after the drop reattaches (or joins the reattached stream).
    let r = tokio::time::timeout(
        Duration::from_secs(20),
        conn.call(
            file_op("r-a", "read_file", json!({"path": "a.txt"})),
            |_| {},
        ),
    )
    .await
    .expect("hung after the drop")
    .unwrap();
    assert!(ok_output(&r)["content"].as_str().unwrap().contains('A'));
    let (streamed, done) = tokio::time::timeout(Duration::from_secs(30), run)
        .await
        .expect("the run's call hung after the drop")
        .unwrap();
    let Body::Result(record) = done.body else {
        panic!("not a result: {done:?}");
    };
    let lines: Vec<&str> = record.stdout.lines().collect();
    assert_eq!(lines.len(), 11, "one execution: {:?}", record.stdout);
    let want: Vec<String> = (1..=10).map(|i| format!("line-{i}")).collect();
    assert_eq!(lines[..10], want);
    assert_eq!(streamed, record.stdout, "every line streamed exactly once");
    assert_eq!(
        opens.load(Ordering::SeqCst),
        2,
        "one reattach for every call"
    );
}

fn unreachable_err(why: String) -> toolrun_operator::relay::RelayError {
    toolrun_operator::relay::RelayError::Unreachable {
        pod: "fifo-agent".into(),
        attempts: 1,
        last: why,
    }
}
