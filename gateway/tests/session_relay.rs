//! The file tools over the kubernetes session path, without a cluster: the gateway's remote
//! [`SessionFiles`] (its SessionRelay client) against the operator's relay server in
//! process, in front of a REAL `toolrun-runner agent` (piped stdin/stdout standing for the
//! pod's attach stream). Only the Kubernetes lookups are tables. Every tool runs twice,
//! once on a local workspace (today's path) and once through the relay, and the answers
//! must be the same: outputs, error codes, approval asks (their diffs).

mod sandbox_common;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::process::{Child, Command};
use toolrun::config::ApprovalMode;
use toolrun::error::ErrorCode;
use toolrun::session::Session;
use toolrun::session::files::{RelayClient, SessionFiles};
use toolrun::tool::{CallContext, Tool};
use toolrun::tools::files::{
    DeleteFile, Edit, FileTool, Glob, Grep, ListDirectory, MoveFile, ReadFile, WriteFile,
};
use toolrun_operator::relay::Connection;
use toolrun_operator::session::relay_server::{
    RelayService, SessionTarget, TableAgents, TableSessions, serve,
};
use toolrun_workspace::{Workspace, WorkspaceLimits};

const TOKEN: &str = "gateway-test-relay-token-0123456789";

fn runner() -> PathBuf {
    sandbox_common::ensure_runner_built();
    let exe = std::env::current_exe().unwrap();
    let p = exe
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("toolrun-runner");
    assert!(p.is_file(), "{} is missing", p.display());
    p
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "session-relay-{name}-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

struct Remote {
    addr: std::net::SocketAddr,
    files: SessionFiles,
    relay: RelayClient,
    agent: Child,
    _stop: tokio_util::sync::DropGuard,
}

/// A local agent serving a fresh workspace as ToolSession `ts-1` of tenant `acme`, the
/// operator's relay in front of it, and the gateway's client.
async fn remote() -> Remote {
    remote_with(&[]).await
}

/// [`remote`] with more arguments for the agent.
async fn remote_with(agent_args: &[&str]) -> Remote {
    let ws = temp_dir("remote");
    let mut agent = Command::new(runner())
        .args(["agent", "--require-unreachable", "off", "--workspace"])
        .arg(&ws)
        .args(agent_args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let conn = Connection::over(
        "pod-1",
        agent.stdin.take().unwrap(),
        agent.stdout.take().unwrap(),
    );
    let sessions = Arc::new(TableSessions::default());
    sessions.set(
        "ts-1",
        SessionTarget {
            tenant: "acme".into(),
            pod: Some("pod-1".into()),
            state: "phase Ready".into(),
        },
    );
    let agents = Arc::new(TableAgents::default());
    agents.set("pod-1", conn);
    let service = RelayService::new(TOKEN.into(), sessions, agents, Duration::from_secs(10))
        .with_max_attempts(2);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    tokio::spawn(serve(listener, service, stop.clone()));
    let relay =
        RelayClient::new(&format!("http://{addr}"), TOKEN, Duration::from_secs(20)).unwrap();
    Remote {
        addr,
        files: relay.files("ts-1", "acme"),
        relay,
        agent,
        _stop: stop.drop_guard(),
    }
}

fn local() -> SessionFiles {
    let ws = Workspace::open(&temp_dir("local"), WorkspaceLimits::default()).unwrap();
    SessionFiles::Local(Arc::new(ws))
}

fn ctx(files: &SessionFiles) -> CallContext {
    let mut ctx = CallContext::with_timeout("call-1", Duration::from_secs(30));
    ctx.session = Some(Session::detached(
        "s-1",
        "acme",
        ApprovalMode::Safe,
        files.clone(),
    ));
    ctx.session_id = "s-1".into();
    ctx
}

/// Drops what differs between two workspaces made at different times.
fn normalise(mut v: Value) -> Value {
    match &mut v {
        Value::Object(map) => {
            map.remove("modified");
            for (_, x) in map.iter_mut() {
                *x = normalise(x.take());
            }
        }
        Value::Array(items) => {
            for x in items.iter_mut() {
                *x = normalise(x.take());
            }
        }
        _ => {}
    }
    v
}

async fn run(
    tool: &dyn Tool,
    files: &SessionFiles,
    args: &Value,
) -> Result<Value, (ErrorCode, String)> {
    tool.call(args.clone(), &ctx(files))
        .await
        .map(normalise)
        .map_err(|e| (e.code, e.message))
}

#[tokio::test]
async fn every_file_tool_answers_the_same_through_the_relay() {
    let r = remote().await;
    let l = local();
    let tools: Vec<(&str, Box<dyn Tool>)> = vec![
        ("read_file", Box::new(FileTool::<ReadFile>::default())),
        ("write_file", Box::new(FileTool::<WriteFile>::default())),
        (
            "list_directory",
            Box::new(FileTool::<ListDirectory>::default()),
        ),
        ("delete_file", Box::new(FileTool::<DeleteFile>::default())),
        ("move_file", Box::new(FileTool::<MoveFile>::default())),
        ("glob", Box::new(FileTool::<Glob>::default())),
        ("grep", Box::new(FileTool::<Grep>::default())),
        ("edit", Box::new(FileTool::<Edit>::default())),
    ];
    let tool = |name: &str| {
        tools
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, t)| t.as_ref())
            .unwrap()
    };
    // A script of calls, successes and failures of every kind.
    let script = [
        (
            "write_file",
            json!({"path": "src/main.py", "content": "def f():\n    return 1\n", "createDirs": true}),
        ),
        (
            "write_file",
            json!({"path": "notes.txt", "content": "alpha\nbeta\nbeta\n"}),
        ),
        (
            "write_file",
            json!({"path": "bin.dat", "content": "AAEC/w==", "encoding": "base64"}),
        ),
        ("read_file", json!({"path": "src/main.py"})),
        (
            "read_file",
            json!({"path": "/workspace/notes.txt", "offset": 2, "limit": 1}),
        ),
        ("read_file", json!({"path": "bin.dat"})),
        (
            "read_file",
            json!({"path": "bin.dat", "encoding": "base64"}),
        ),
        ("read_file", json!({"path": "missing.txt"})),
        ("read_file", json!({"path": "../escape"})),
        ("read_file", json!({"path": "/etc/passwd"})),
        ("read_file", json!({"path": "src"})),
        ("list_directory", json!({"path": ".", "recursive": true})),
        ("list_directory", json!({"path": "notes.txt"})),
        ("glob", json!({"pattern": "**/*.py"})),
        ("grep", json!({"pattern": "beta", "path": "."})),
        ("grep", json!({"pattern": "("})),
        (
            "edit",
            json!({"path": "notes.txt", "old_string": "beta", "new_string": "gamma"}),
        ),
        (
            "edit",
            json!({"path": "notes.txt", "old_string": "absent", "new_string": "x"}),
        ),
        (
            "edit",
            json!({"path": "notes.txt", "old_string": "beta", "new_string": "gamma", "replace_all": true}),
        ),
        (
            "move_file",
            json!({"from": "notes.txt", "to": "src/main.py"}),
        ),
        (
            "move_file",
            json!({"from": "notes.txt", "to": "old/notes.txt"}),
        ),
        ("move_file", json!({"from": "notes.txt", "to": "n2.txt"})),
        ("delete_file", json!({"path": "src"})),
        ("delete_file", json!({"path": "src", "recursive": true})),
        ("delete_file", json!({"path": "."})),
        ("list_directory", json!({"path": "."})),
    ];
    let mut failures = 0;
    for (name, args) in &script {
        let want = run(tool(name), &l, args).await;
        let got = run(tool(name), &r.files, args).await;
        match (&want, &got) {
            (Ok(a), Ok(b)) => assert_eq!(a, b, "{name} {args}"),
            (Err((a, am)), Err((b, bm))) => {
                failures += 1;
                assert_eq!(a, b, "{name} {args}: {am} vs {bm}");
                assert_eq!(am, bm, "{name} {args}");
            }
            _ => panic!("{name} {args}: local {want:?}, remote {got:?}"),
        }
    }
    assert!(
        failures >= 8,
        "the script's failures were not failures: {failures}"
    );
}

#[tokio::test]
async fn approvals_ask_the_same_with_the_same_diffs() {
    let r = remote().await;
    let l = local();
    for files in [&l, &r.files] {
        let write = FileTool::<WriteFile>::default();
        write
            .call(
                json!({"path": "a.txt", "content": "one\ntwo\n"}),
                &ctx(files),
            )
            .await
            .unwrap();
    }
    let cases: Vec<(Box<dyn Tool>, Value)> = vec![
        // A new file asks nothing; an overwrite asks with the diff.
        (
            Box::new(FileTool::<WriteFile>::default()),
            json!({"path": "new.txt", "content": "x"}),
        ),
        (
            Box::new(FileTool::<WriteFile>::default()),
            json!({"path": "a.txt", "content": "one\nTWO\n"}),
        ),
        (
            Box::new(FileTool::<Edit>::default()),
            json!({"path": "a.txt", "old_string": "two", "new_string": "three"}),
        ),
        (
            Box::new(FileTool::<Edit>::default()),
            json!({"path": "a.txt", "old_string": "nope", "new_string": "x"}),
        ),
        (
            Box::new(FileTool::<MoveFile>::default()),
            json!({"from": "a.txt", "to": "b.txt"}),
        ),
        (
            Box::new(FileTool::<MoveFile>::default()),
            json!({"from": "new.txt", "to": "a.txt", "overwrite": true}),
        ),
        (
            Box::new(FileTool::<DeleteFile>::default()),
            json!({"path": "a.txt"}),
        ),
        (
            Box::new(FileTool::<ReadFile>::default()),
            json!({"path": "a.txt"}),
        ),
    ];
    let mut asked = 0;
    for (tool, args) in &cases {
        let want = tool.approval(args, &ctx(&l)).await.unwrap();
        let got = tool.approval(args, &ctx(&r.files)).await.unwrap();
        let show = |a: &Option<toolrun::approval::ApprovalAsk>| {
            a.as_ref()
                .map(|a| (format!("{:?}", a.kind), a.reason.clone()))
        };
        assert_eq!(show(&want), show(&got), "{} {args}", tool.metadata().id);
        asked += usize::from(want.is_some());
    }
    assert_eq!(asked, 5, "write over, 2 edits, move over, delete");
    // The overwrite's reason carries the real diff, computed in the agent.
    let ask = FileTool::<WriteFile>::default()
        .approval(
            &json!({"path": "a.txt", "content": "one\nTWO\n"}),
            &ctx(&r.files),
        )
        .await
        .unwrap()
        .unwrap();
    assert!(
        ask.reason.contains("-two") && ask.reason.contains("+TWO"),
        "{}",
        ask.reason
    );
    // Asking changed nothing.
    let read = FileTool::<ReadFile>::default()
        .call(json!({"path": "a.txt"}), &ctx(&r.files))
        .await
        .unwrap();
    assert!(read["content"].as_str().unwrap().contains("two"), "{read}");
    // The shell's working-directory check, the same both ways.
    for files in [&l, &r.files] {
        assert_eq!(files.resolve_dir("/workspace").await.unwrap(), "");
        assert_eq!(
            files.resolve_dir("a.txt").await.unwrap_err().code,
            ErrorCode::NotADirectory
        );
        assert!(files.exists("a.txt").await.unwrap());
        assert!(!files.exists("zzz").await.unwrap());
    }
}

#[tokio::test]
async fn relay_failures_are_typed_tool_errors() {
    let mut r = remote().await;
    let read = FileTool::<ReadFile>::default();
    let args = json!({"path": "absent.txt"});
    // Control: the session answers (the core's FILE_NOT_FOUND).
    let err = read.call(args.clone(), &ctx(&r.files)).await.unwrap_err();
    assert_eq!(err.code, ErrorCode::FileNotFound, "{}", err.message);
    // Another tenant, or a session the operator does not know: SESSION_NOT_FOUND.
    for files in [
        r.relay.files("ts-1", "other"),
        r.relay.files("ts-9", "acme"),
    ] {
        let err = read.call(args.clone(), &ctx(&files)).await.unwrap_err();
        assert_eq!(err.code, ErrorCode::SessionNotFound, "{}", err.message);
    }
    // The agent dies: UNAVAILABLE within the relay's bounds, not a hang.
    r.agent.kill().await.unwrap();
    let err = tokio::time::timeout(
        Duration::from_secs(15),
        read.call(json!({"path": "x"}), &ctx(&r.files)),
    )
    .await
    .expect("hung")
    .unwrap_err();
    assert_eq!(err.code, ErrorCode::Unavailable, "{}", err.message);
    assert!(err.message.contains("AGENT_UNREACHABLE"), "{}", err.message);
}

#[tokio::test]
async fn a_wrong_relay_token_is_unavailable() {
    let r = remote().await;
    let read = FileTool::<ReadFile>::default();
    let args = json!({"path": "nothing"});
    // Control: the right token reaches the agent (its FILE_NOT_FOUND).
    let err = read.call(args.clone(), &ctx(&r.files)).await.unwrap_err();
    assert_eq!(err.code, ErrorCode::FileNotFound, "{}", err.message);
    let wrong = RelayClient::new(
        &format!("http://{}", r.addr),
        "not-the-token-0123456789abcdef",
        Duration::from_secs(5),
    )
    .unwrap()
    .files("ts-1", "acme");
    let err = read.call(args, &ctx(&wrong)).await.unwrap_err();
    assert_eq!(err.code, ErrorCode::Unavailable, "{}", err.message);
    assert!(err.message.contains("relay token"), "{}", err.message);
}

#[tokio::test]
async fn get_session_reports_the_pods_usage_through_the_relay() {
    // The operator passes the session's size: the limit GetSession reports.
    let limit: u64 = 64 << 20;
    let mut r = remote_with(&["--workspace-limit-bytes", &limit.to_string()]).await;
    let session = Session::detached("s-1", "acme", ApprovalMode::All, r.files.clone());
    let empty = session.usage().await;
    assert_eq!(empty.bytes_limit, limit, "{empty:?}");
    assert_eq!(empty.files_used, 1, "the workspace root: {empty:?}");
    assert!(empty.files_limit > 0, "{empty:?}");
    // 1 MiB written through the relay is 1 MiB more used, in GetSession's wire form too.
    let content: String = (0..1u32 << 20)
        .map(|i| char::from(b'a' + (i.wrapping_mul(2_654_435_761) >> 27) as u8 % 26))
        .collect();
    FileTool::<WriteFile>::default()
        .call(
            json!({"path": "big.txt", "content": content}),
            &ctx(&r.files),
        )
        .await
        .unwrap();
    let wire = toolrun::grpc::session_proto(&session, session.usage().await);
    assert!(
        wire.workspace_bytes_used >= empty.bytes_used + (1 << 20),
        "{empty:?} then {wire:?}"
    );
    assert!(wire.workspace_bytes_used <= wire.workspace_bytes_limit);
    assert_eq!(wire.workspace_bytes_limit, limit);
    assert_eq!(wire.workspace_files_used, 2);
    // ListSessions' form: several at once, in order.
    let other = Session::detached(
        "s-2",
        "other",
        ApprovalMode::All,
        r.relay.files("ts-1", "other"),
    );
    let both = toolrun::session::usage_of(&[session.clone(), other]).await;
    assert_eq!(both[0].bytes_used, wire.workspace_bytes_used);
    // Another tenant's session does not exist for the caller: nothing reported.
    assert_eq!(both[1], Default::default());
    // A detached local session (no volume of its own): the same core walks its directory.
    let here = Session::detached("s-3", "acme", ApprovalMode::All, local())
        .usage()
        .await;
    assert_eq!(here.files_used, 1, "{here:?}");
    assert!(here.bytes_limit > 0, "{here:?}");
    // A dead agent: zeros within the bound, never an error or a hang.
    r.agent.kill().await.unwrap();
    let t = std::time::Instant::now();
    let gone = session.usage().await;
    assert_eq!(gone, Default::default());
    assert!(
        t.elapsed() <= toolrun::session::USAGE_TIMEOUT + Duration::from_secs(1),
        "{:?}",
        t.elapsed()
    );
}
