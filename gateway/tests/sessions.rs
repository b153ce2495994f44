//! Sessions, workspaces, the file tools, shell and approvals end to end: a real gateway
//! (local sandbox, ext4 loop-mounted workspaces; run as root) called over gRPC, each test
//! with its own server and state dir. SECURITY-CASES.md 15-18 and 40-49 through the
//! gateway's front door.

mod sandbox_common;

use std::future::Future;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use sandbox_common::ensure_runner_built;
use serde_json::{Value, json};
use tonic::Code;
use toolrun::serve::{Running, ServeArgs, ServeError, start};
use toolrun_proto::v1 as pb;
use toolrun_proto::v1::tool_service_client::ToolServiceClient;

type Client = ToolServiceClient<tonic::transport::Channel>;

/// Bound of every test body: nothing may hang.
const TEST_BOUND: Duration = Duration::from_secs(80);
/// Bound of one RPC that should answer promptly.
const RPC_BOUND: Duration = Duration::from_secs(30);

// ---------------------------------------------------------------- harness

/// Runs a test body within [`TEST_BOUND`].
async fn bounded<F: Future>(f: F) -> F::Output {
    tokio::time::timeout(TEST_BOUND, f)
        .await
        .expect("the test did not finish in time")
}

/// Awaits `f` within [`RPC_BOUND`], naming `what` when it does not answer.
async fn within<F: Future>(what: &str, f: F) -> F::Output {
    tokio::time::timeout(RPC_BOUND, f)
        .await
        .unwrap_or_else(|_| panic!("{what}: no answer within {RPC_BOUND:?}"))
}

/// The config as a temporary file (read once at startup; removed when dropped).
fn config_file(yaml: &str) -> tempfile::NamedTempFile {
    let f = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(f.path(), yaml).unwrap();
    f
}

/// A state dir in a fresh temporary directory (traversable like /var/lib/toolrun).
fn state_dir() -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    d
}

async fn try_start(yaml: &str, state: Option<&Path>) -> Result<Running, ServeError> {
    ensure_runner_built();
    let config = config_file(yaml);
    start(ServeArgs {
        listen: "127.0.0.1:0".parse().unwrap(),
        admin_listen: "127.0.0.1:0".parse().unwrap(),
        config: Some(config.path().to_path_buf()),
        drain_timeout_ms: 1_000,
        max_message_bytes: 32 * 1024 * 1024,
        state_dir: state.map(Path::to_path_buf),
        ..ServeArgs::default()
    })
    .await
}

/// A running gateway on its own state dir.
struct Gw {
    running: Option<Running>,
    c: Client,
    state: PathBuf,
    _tmp: Option<tempfile::TempDir>,
}

impl Gw {
    async fn new(yaml: &str) -> Gw {
        let tmp = state_dir();
        let state = tmp.path().canonicalize().unwrap();
        let mut gw = Gw::on(yaml, &state).await;
        gw._tmp = Some(tmp);
        gw
    }

    async fn on(yaml: &str, state: &Path) -> Gw {
        let running = within("server start", try_start(yaml, Some(state)))
            .await
            .expect("gateway with the local sandbox starts (run the tests as root)");
        let c = connect(&running).await;
        Gw {
            running: Some(running),
            c,
            state: state.to_path_buf(),
            _tmp: None,
        }
    }

    fn ws(&self, id: &str) -> PathBuf {
        self.state.join("workspaces").join(id)
    }

    fn image(&self, id: &str) -> PathBuf {
        self.state.join("workspaces").join(format!("{id}.img"))
    }

    fn record(&self, id: &str) -> PathBuf {
        self.state.join("sessions").join(format!("{id}.json"))
    }

    /// Graceful shutdown, waited for.
    async fn stop(&mut self) {
        if let Some(r) = self.running.take() {
            r.shutdown();
            within("server shutdown", r.wait())
                .await
                .expect("server stops cleanly");
        }
    }
}

/// A test that fails before [`Gw::stop`] would leave its workspaces mounted (and its state
/// dir undeletable): stop the server and detach them.
impl Drop for Gw {
    fn drop(&mut self) {
        if let Some(r) = self.running.take() {
            r.shutdown();
        }
        let prefix = format!("{}/", self.state.join("workspaces").display());
        let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        for mp in info.lines().filter_map(|l| l.split(' ').nth(4)) {
            if mp.starts_with(&prefix) {
                let _ = std::process::Command::new("umount")
                    .arg("-l")
                    .arg(mp)
                    .status();
            }
        }
    }
}

async fn connect(running: &Running) -> Client {
    ToolServiceClient::connect(format!("http://{}", running.grpc_addr))
        .await
        .unwrap()
        .max_decoding_message_size(64 * 1024 * 1024)
        .max_encoding_message_size(64 * 1024 * 1024)
}

async fn create(
    c: &mut Client,
    id: &str,
    mode: pb::ApprovalMode,
    idle: u32,
) -> Result<pb::Session, tonic::Status> {
    within(
        "CreateSession",
        c.create_session(pb::CreateSessionRequest {
            session_id: id.into(),
            approval_mode: mode as i32,
            idle_timeout_seconds: idle,
        }),
    )
    .await
    .map(|r| r.into_inner())
}

/// A new session in mode `mode` with a generated id.
async fn session(c: &mut Client, mode: pb::ApprovalMode) -> String {
    create(c, "", mode, 0)
        .await
        .expect("CreateSession")
        .session_id
}

async fn get(c: &mut Client, id: &str) -> Result<pb::Session, tonic::Status> {
    within(
        "GetSession",
        c.get_session(pb::GetSessionRequest {
            session_id: id.into(),
        }),
    )
    .await
    .map(|r| r.into_inner())
}

async fn close(c: &mut Client, id: &str) -> Result<pb::CloseSessionResponse, tonic::Status> {
    within(
        "CloseSession",
        c.close_session(pb::CloseSessionRequest {
            session_id: id.into(),
        }),
    )
    .await
    .map(|r| r.into_inner())
}

fn req(sid: &str, tool: &str, args: &Value, timeout_ms: u32) -> pb::CallToolRequest {
    pb::CallToolRequest {
        call_id: format!("c-{tool}-{}", uuid_like()),
        tool: tool.into(),
        arguments_json: args.to_string(),
        timeout_ms,
        session_id: sid.into(),
    }
}

fn uuid_like() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        "{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// A unique marker for process and file names.
fn unique(prefix: &str) -> String {
    format!("{prefix}{}", uuid_like().replace('-', "x"))
}

/// The result of one call and its output (Null when none).
async fn call_req(c: &mut Client, r: pb::CallToolRequest) -> (pb::ToolResult, Value) {
    let what = format!("CallTool {}", r.tool);
    let res = within(&what, c.call_tool(r))
        .await
        .expect("rpc ok")
        .into_inner()
        .result
        .expect("a result");
    let out = if res.output_json.is_empty() {
        Value::Null
    } else {
        serde_json::from_str(&res.output_json).unwrap()
    };
    (res, out)
}

async fn call(c: &mut Client, sid: &str, tool: &str, args: Value) -> (pb::ToolResult, Value) {
    call_req(c, req(sid, tool, &args, 0)).await
}

/// A call that must succeed; its output.
async fn ok(c: &mut Client, sid: &str, tool: &str, args: Value) -> Value {
    let (r, out) = call(c, sid, tool, args.clone()).await;
    assert!(r.ok, "{tool} {args} failed: {r:?}");
    out
}

fn code(r: &pb::ToolResult) -> String {
    match &r.error {
        Some(e) => toolrun::grpc::error_code_name(e.code),
        None => "OK".into(),
    }
}

fn message(r: &pb::ToolResult) -> String {
    r.error
        .as_ref()
        .map(|e| e.message.clone())
        .unwrap_or_default()
}

/// Asserts a failed call's code.
fn assert_code(r: &pb::ToolResult, want: &str, what: &str) {
    assert_eq!(code(r), want, "{what}: {r:?}");
    assert!(!r.ok, "{what}: {r:?}");
}

async fn shell(c: &mut Client, sid: &str, command: &str) -> Value {
    let out = ok(c, sid, "shell", json!({ "command": command })).await;
    assert_eq!(out["exit_code"], 0, "{command}: {out}");
    out
}

async fn stream(c: &mut Client, r: pb::CallToolRequest) -> tonic::Streaming<pb::ToolEvent> {
    within("StreamTool", c.stream_tool(r))
        .await
        .expect("StreamTool rpc")
        .into_inner()
}

async fn next_event(s: &mut tonic::Streaming<pb::ToolEvent>) -> pb::tool_event::Event {
    within("next ToolEvent", s.message())
        .await
        .expect("stream ok")
        .expect("stream not ended")
        .event
        .expect("event set")
}

/// Reads a stream to its result; returns the stdout seen before it and the result.
async fn stream_result(s: &mut tonic::Streaming<pb::ToolEvent>) -> (String, pb::ToolResult) {
    let mut stdout = String::new();
    loop {
        match next_event(s).await {
            pb::tool_event::Event::Stdout(c) => stdout.push_str(&String::from_utf8_lossy(&c.data)),
            pb::tool_event::Event::Result(r) => return (stdout, r),
            _ => {}
        }
    }
}

async fn approvals(c: &mut Client, sid: &str) -> Vec<pb::Approval> {
    within(
        "ListApprovals",
        c.list_approvals(pb::ListApprovalsRequest {
            session_id: sid.into(),
        }),
    )
    .await
    .expect("ListApprovals")
    .into_inner()
    .approvals
}

/// Waits (up to 15 s) until `sid` has a pending approval other than those in `seen`.
async fn wait_approval(c: &mut Client, sid: &str, seen: &[String]) -> pb::Approval {
    let end = Instant::now() + Duration::from_secs(15);
    loop {
        if let Some(a) = approvals(c, sid)
            .await
            .into_iter()
            .find(|a| !seen.contains(&a.approval_id))
        {
            return a;
        }
        assert!(Instant::now() < end, "no approval appeared in {sid}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn decide(
    c: &mut Client,
    id: &str,
    approve: bool,
    args: &str,
    msg: &str,
) -> Result<pb::DecideApprovalResponse, tonic::Status> {
    within(
        "DecideApproval",
        c.decide_approval(pb::DecideApprovalRequest {
            approval_id: id.into(),
            approve,
            arguments_json: args.into(),
            message: msg.into(),
        }),
    )
    .await
    .map(|r| r.into_inner())
}

/// Starts a call on its own connection; the join handle yields its result.
fn spawn_call(
    c: &Client,
    r: pb::CallToolRequest,
) -> tokio::task::JoinHandle<(pb::ToolResult, Value)> {
    let mut c = c.clone();
    tokio::spawn(async move {
        let res = c
            .call_tool(r)
            .await
            .expect("rpc ok")
            .into_inner()
            .result
            .expect("a result");
        let out = if res.output_json.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&res.output_json).unwrap()
        };
        (res, out)
    })
}

async fn join<T>(h: tokio::task::JoinHandle<T>) -> T {
    within("spawned call", h).await.expect("call task")
}

fn kind(a: &pb::Approval) -> pb::ApprovalKind {
    pb::ApprovalKind::try_from(a.kind).unwrap()
}

/// Whether `path` is a mount point in this process's mount table.
fn mounted(path: &Path) -> bool {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let want = path.to_str().unwrap();
    info.lines().any(|l| {
        l.split(' ')
            .nth(4)
            .is_some_and(|mp| mp.replace("\\040", " ") == want)
    })
}

/// Host processes whose command line contains `marker`.
fn host_processes_with(marker: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.chars().all(|c| c.is_ascii_digit()) {
            continue;
        }
        if let Ok(cmd) = std::fs::read(entry.path().join("cmdline")) {
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            if cmd.contains(marker) {
                found.push(format!("{name}: {cmd}"));
            }
        }
    }
    found
}

/// Polls `f` every 50 ms until it holds; fails after `deadline` naming `what`.
async fn wait_until(what: &str, deadline: Duration, mut f: impl FnMut() -> bool) {
    let end = Instant::now() + deadline;
    while !f() {
        assert!(
            Instant::now() < end,
            "timed out after {deadline:?} waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Asserts nothing of session `id` is left: no mount, no workspace dir, no image, no record.
fn assert_session_gone(gw: &Gw, id: &str) {
    assert!(!mounted(&gw.ws(id)), "{id}: workspace still mounted");
    assert!(!gw.ws(id).exists(), "{id}: workspace dir left");
    assert!(!gw.image(id).exists(), "{id}: image left");
    assert!(!gw.record(id).exists(), "{id}: record left");
}

fn is_generated_id(id: &str) -> bool {
    id.len() == 34
        && id.starts_with("s-")
        && id[2..]
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

const ALL: pb::ApprovalMode = pb::ApprovalMode::All;
const SAFE: pb::ApprovalMode = pb::ApprovalMode::Safe;
const NONE: pb::ApprovalMode = pb::ApprovalMode::None;
const UNSPECIFIED: pb::ApprovalMode = pb::ApprovalMode::Unspecified;

// ---------------------------------------------------------------- 1. lifecycle

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_create_get_list_close() {
    bounded(async {
        let mut gw = Gw::new("{}").await;
        let c = &mut gw.c.clone();

        // Generated id: s- and 128 random bits; the server's defaults.
        let s = create(c, "", UNSPECIFIED, 0).await.unwrap();
        assert!(is_generated_id(&s.session_id), "{}", s.session_id);
        assert_eq!(s.approval_mode, SAFE as i32);
        assert_eq!(s.idle_timeout_seconds, 1800);
        assert_eq!(s.workspace_path, "/workspace");
        assert!(
            s.workspace_bytes_limit > 0 && s.workspace_files_limit > 0,
            "{s:?}"
        );
        assert!(s.expires_at_ms > s.created_at_ms);
        let other = create(c, "", UNSPECIFIED, 0).await.unwrap();
        assert!(is_generated_id(&other.session_id));
        assert_ne!(other.session_id, s.session_id);

        // A given id, kept; its mode and idle timeout as asked.
        let mine = create(c, "my-sess_1", ALL, 60).await.unwrap();
        assert_eq!(mine.session_id, "my-sess_1");
        assert_eq!(mine.approval_mode, ALL as i32);
        assert_eq!(mine.idle_timeout_seconds, 60);
        for bad in ["../x", "a/b", "a b", ".hidden", &"x".repeat(65)] {
            let e = create(c, bad, ALL, 0).await.unwrap_err();
            assert_eq!(e.code(), Code::InvalidArgument, "{bad:?}: {e:?}");
        }
        let e = create(c, "my-sess_1", ALL, 0).await.unwrap_err();
        assert_eq!(e.code(), Code::AlreadyExists, "{e:?}");

        // Get and List.
        let got = get(c, "my-sess_1").await.unwrap();
        assert_eq!(got.session_id, "my-sess_1");
        assert_eq!(got.approval_mode, ALL as i32);
        let listed: Vec<String> =
            within("ListSessions", c.list_sessions(pb::ListSessionsRequest {}))
                .await
                .unwrap()
                .into_inner()
                .sessions
                .into_iter()
                .map(|s| s.session_id)
                .collect();
        for id in [&s.session_id, &other.session_id, &mine.session_id] {
            assert!(listed.contains(id), "{id} not in {listed:?}");
        }
        assert_eq!(listed.len(), 3, "{listed:?}");

        // The workspace: a mounted ext4 filesystem with its image and record.
        ok(
            c,
            "my-sess_1",
            "write_file",
            json!({"path": "a.txt", "content": "hi"}),
        )
        .await;
        assert!(mounted(&gw.ws("my-sess_1")));
        assert!(gw.image("my-sess_1").is_file());
        assert!(gw.record("my-sess_1").is_file());
        assert_eq!(
            std::fs::read_to_string(gw.ws("my-sess_1").join("a.txt")).unwrap(),
            "hi"
        );
        let used = get(c, "my-sess_1").await.unwrap();
        assert!(used.workspace_files_used >= 1, "{used:?}");

        // Close: gone everywhere.
        let closed = close(c, "my-sess_1").await.unwrap();
        assert_eq!(closed.session.unwrap().session_id, "my-sess_1");
        assert_eq!(closed.calls_cancelled, 0);
        assert_eq!(
            get(c, "my-sess_1").await.unwrap_err().code(),
            Code::NotFound
        );
        let (r, _) = call(c, "my-sess_1", "read_file", json!({"path": "a.txt"})).await;
        assert_code(&r, "SESSION_NOT_FOUND", "read_file in a closed session");
        assert_session_gone(&gw, "my-sess_1");
        assert_eq!(
            close(c, "my-sess_1").await.unwrap_err().code(),
            Code::NotFound
        );

        // An unknown id is never created silently.
        let (r, _) = call(
            c,
            "no-such-session",
            "write_file",
            json!({"path": "x", "content": ""}),
        )
        .await;
        assert_code(&r, "SESSION_NOT_FOUND", "write_file in an unknown session");
        let (r, _) = call(c, "no-such-session", "shell", json!({"command": "true"})).await;
        assert_code(&r, "SESSION_NOT_FOUND", "shell in an unknown session");
        assert_eq!(
            get(c, "no-such-session").await.unwrap_err().code(),
            Code::NotFound
        );
        assert!(!gw.ws("no-such-session").exists());
        assert!(!gw.record("no-such-session").exists());
        gw.stop().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_sessions_is_resource_exhausted() {
    bounded(async {
        let mut gw = Gw::new("sessions:\n  max_sessions: 2\n").await;
        let c = &mut gw.c.clone();
        let a = session(c, ALL).await;
        let _b = session(c, ALL).await;
        let e = create(c, "", ALL, 0).await.unwrap_err();
        assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
        let e = create(c, "third", ALL, 0).await.unwrap_err();
        assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
        assert!(!gw.ws("third").exists() && !gw.record("third").exists());
        close(c, &a).await.unwrap();
        create(c, "third", ALL, 0)
            .await
            .expect("a slot is free again");
        gw.stop().await;
    })
    .await
}

// ---------------------------------------------------------------- 2. file tools

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_file_tool_over_grpc() {
    bounded(async {
        let mut gw = Gw::new("{}").await;
        let c = &mut gw.c.clone();
        let s = session(c, ALL).await;
        let host = gw.ws(&s);

        // write_file with createDirs; without it a missing parent fails.
        let out = ok(
            c,
            &s,
            "write_file",
            json!({"path": "dir/sub/a.txt", "content": "one\ntwo\nthree\nfour\n", "createDirs": true}),
        )
        .await;
        assert_eq!(out["created"], true, "{out}");
        assert_eq!(out["size"], 19);
        assert_eq!(
            std::fs::read_to_string(host.join("dir/sub/a.txt")).unwrap(),
            "one\ntwo\nthree\nfour\n"
        );
        let (r, _) = call(c, &s, "write_file", json!({"path": "nodir/x.txt", "content": "x"})).await;
        assert!(!r.ok, "{r:?}");
        assert!(!host.join("nodir").exists());
        ok(
            c,
            &s,
            "write_file",
            json!({"path": "/workspace/d2/b.txt", "content": "bee\n", "createDirs": true}),
        )
        .await;
        assert_eq!(std::fs::read_to_string(host.join("d2/b.txt")).unwrap(), "bee\n");

        // read_file: numbered lines as cat -n, offset/limit in lines.
        let out = ok(c, &s, "read_file", json!({"path": "dir/sub/a.txt", "offset": 2, "limit": 2})).await;
        assert_eq!(out["content"], "     2\ttwo\n     3\tthree\n", "{out}");
        assert_eq!(out["size"], 19);
        assert_eq!(out["binary"], false);
        let out = ok(c, &s, "read_file", json!({"path": "/workspace/dir/sub/a.txt"})).await;
        assert!(out["content"].as_str().unwrap().starts_with("     1\tone\n"), "{out}");
        let (r, _) = call(c, &s, "read_file", json!({"path": "missing.txt"})).await;
        assert_code(&r, "FILE_NOT_FOUND", "read_file of a missing file");
        for bad in ["../x", "/etc/passwd", "a\u{0}b", "dir/../../x"] {
            let (r, _) = call(c, &s, "read_file", json!({ "path": bad })).await;
            assert_code(&r, "INVALID_PATH", &format!("read_file {bad:?}"));
        }

        // list_directory recursive.
        let out = ok(c, &s, "list_directory", json!({"path": ".", "recursive": true})).await;
        let names: Vec<&str> = out["entries"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["name"].as_str().unwrap())
            .collect();
        assert!(
            names.iter().any(|n| n.ends_with("a.txt")) && names.iter().any(|n| n.ends_with("b.txt")),
            "{out}"
        );
        let out = ok(c, &s, "list_directory", json!({"path": "dir/sub"})).await;
        assert_eq!(out["entries"][0]["name"], "a.txt", "{out}");
        assert_eq!(out["entries"][0]["type"], "file", "{out}");
        assert_eq!(out["entries"][0]["size"], 19, "{out}");

        // glob: newest first.
        ok(c, &s, "write_file", json!({"path": "g/old.rs", "content": "1", "createDirs": true})).await;
        // ext4 keeps nanosecond mtimes; make the order unambiguous anyway.
        let old = std::fs::File::options().write(true).open(host.join("g/old.rs")).unwrap();
        old.set_modified(std::time::SystemTime::now() - Duration::from_secs(60)).unwrap();
        ok(c, &s, "write_file", json!({"path": "g/new.rs", "content": "2"})).await;
        let out = ok(c, &s, "glob", json!({"pattern": "**/*.rs"})).await;
        assert_eq!(out["files"], json!(["g/new.rs", "g/old.rs"]), "{out}");
        let out = ok(c, &s, "glob", json!({"pattern": "*.txt", "path": "dir/sub"})).await;
        assert_eq!(out["count"], 1, "{out}");

        // edit: no match, several matches, success (with the change shown).
        ok(c, &s, "write_file", json!({"path": "e.txt", "content": "x = 1\ny = 1\n"})).await;
        let (r, _) = call(c, &s, "edit", json!({"path": "e.txt", "old_string": "z = 1", "new_string": "z = 2"})).await;
        assert_code(&r, "NO_MATCH", "edit of absent text");
        let (r, _) = call(c, &s, "edit", json!({"path": "e.txt", "old_string": "= 1", "new_string": "= 2"})).await;
        assert_code(&r, "AMBIGUOUS_MATCH", "edit of text found twice");
        assert!(message(&r).contains('2'), "says how many: {r:?}");
        let out = ok(c, &s, "edit", json!({"path": "e.txt", "old_string": "y = 1", "new_string": "y = 2"})).await;
        assert_eq!(out["replacements"], 1, "{out}");
        assert!(out["diff"].as_str().unwrap().contains("+y = 2"), "{out}");
        assert_eq!(std::fs::read_to_string(host.join("e.txt")).unwrap(), "x = 1\ny = 2\n");
        let out = ok(
            c,
            &s,
            "edit",
            json!({"path": "e.txt", "old_string": "= ", "new_string": ":= ", "replace_all": true}),
        )
        .await;
        assert_eq!(out["replacements"], 2, "{out}");

        // move_file: refused over an existing file unless overwrite.
        ok(c, &s, "write_file", json!({"path": "m1.txt", "content": "m1"})).await;
        ok(c, &s, "write_file", json!({"path": "m2.txt", "content": "m2"})).await;
        let (r, _) = call(c, &s, "move_file", json!({"from": "m1.txt", "to": "m2.txt"})).await;
        assert_code(&r, "ALREADY_EXISTS", "move over an existing file");
        assert_eq!(std::fs::read_to_string(host.join("m2.txt")).unwrap(), "m2");
        let out = ok(c, &s, "move_file", json!({"from": "m1.txt", "to": "m2.txt", "overwrite": true})).await;
        assert_eq!(out["overwritten"], true, "{out}");
        assert_eq!(std::fs::read_to_string(host.join("m2.txt")).unwrap(), "m1");
        assert!(!host.join("m1.txt").exists());
        ok(c, &s, "move_file", json!({"from": "m2.txt", "to": "dir/m3.txt"})).await;
        assert!(host.join("dir/m3.txt").is_file());

        // delete_file: a directory needs recursive.
        let (r, _) = call(c, &s, "delete_file", json!({"path": "dir"})).await;
        assert!(!r.ok, "{r:?}");
        assert!(host.join("dir/sub/a.txt").exists());
        let out = ok(c, &s, "delete_file", json!({"path": "dir", "recursive": true})).await;
        assert!(out["count"].as_u64().unwrap() >= 3, "{out}");
        assert!(!host.join("dir").exists());
        ok(c, &s, "delete_file", json!({"path": "e.txt"})).await;
        assert!(!host.join("e.txt").exists());

        // Mode all: nothing asked.
        assert!(approvals(c, &s).await.is_empty());

        // Without a session: INVALID_ARGUMENTS saying a session is needed.
        for (tool, args) in [
            ("read_file", json!({"path": "a"})),
            ("write_file", json!({"path": "a", "content": ""})),
            ("list_directory", json!({"path": "."})),
            ("delete_file", json!({"path": "a"})),
            ("move_file", json!({"from": "a", "to": "b"})),
            ("glob", json!({"pattern": "*"})),
            ("grep", json!({"pattern": "x"})),
            ("edit", json!({"path": "a", "old_string": "x", "new_string": "y"})),
            ("shell", json!({"command": "true"})),
        ] {
            let (r, _) = call(c, "", tool, args).await;
            assert_code(&r, "INVALID_ARGUMENTS", &format!("{tool} without a session"));
            assert!(message(&r).contains("session"), "{tool}: {r:?}");
        }
        gw.stop().await;
    })
    .await
}

// ---------------------------------------------------------------- 3. programs and files

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn programs_and_file_tools_see_the_same_files() {
    bounded(async {
        let mut gw = Gw::new("{}").await;
        let c = &mut gw.c.clone();
        let s = session(c, ALL).await;

        ok(c, &s, "write_file", json!({"path": "from-tool.txt", "content": "written by write_file\n"})).await;
        let out = shell(c, &s, "cat from-tool.txt && pwd").await;
        assert_eq!(out["stdout"], "written by write_file\n/workspace\n", "{out}");

        shell(c, &s, "mkdir -p sub && printf 'from shell\\n' > sub/from-shell.txt").await;
        let out = ok(c, &s, "read_file", json!({"path": "sub/from-shell.txt"})).await;
        assert_eq!(out["content"], "     1\tfrom shell\n", "{out}");
        let out = shell(c, &s, "cd sub && pwd").await;
        assert_eq!(out["stdout"], "/workspace/sub\n");
        let out = ok(c, &s, "shell", json!({"command": "pwd", "cwd": "sub"})).await;
        assert_eq!(out["stdout"], "/workspace/sub\n", "{out}");
        let (r, _) = call(c, &s, "shell", json!({"command": "pwd", "cwd": "../.."})).await;
        assert_code(&r, "INVALID_PATH", "shell cwd outside the workspace");

        // run_code in the session: the workspace is its working directory.
        let code = "import os\nprint(os.getcwd())\nprint(open('from-tool.txt').read(), end='')\nopen('from-py.txt','w').write('py')\n";
        let (r, out) = call_req(
            c,
            req(&s, "run_code", &json!({"language": "python", "code": code}), 0),
        )
        .await;
        assert!(r.ok, "{r:?}");
        assert_eq!(out["stdout"], "/workspace\nwritten by write_file\n", "{out}");
        let out = ok(c, &s, "read_file", json!({"path": "from-py.txt"})).await;
        assert_eq!(out["content"], "     1\tpy\n", "{out}");

        // run_code without a session stays stateless: no /workspace, none of its files.
        let code = "import os\nprint(os.getcwd())\nprint(os.path.exists('/workspace'))\nprint(os.path.exists('from-tool.txt'))\n";
        let (r, out) = call_req(
            c,
            req("", "run_code", &json!({"language": "python", "code": code}), 0),
        )
        .await;
        assert!(r.ok, "{r:?}");
        let stdout = out["stdout"].as_str().unwrap();
        assert!(stdout.ends_with("False\nFalse\n"), "{out}");
        assert_ne!(stdout.lines().next(), Some("/workspace"), "{out}");
        gw.stop().await;
    })
    .await
}

// ---------------------------------------------------------------- 4. shell

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shell_timeout_returns_partial_output_and_the_session_survives() {
    bounded(async {
        let mut gw = Gw::new("{}").await;
        let c = &mut gw.c.clone();
        let s = session(c, ALL).await;
        let marker = unique("shto");
        let cmd = format!(
            "echo started; M={marker}; (exec -a $M-bg sleep 100) & exec -a $M-fg sleep 100"
        );
        let t0 = Instant::now();
        let (r, out) = call(c, &s, "shell", json!({"command": cmd, "timeout": 1500})).await;
        let took = t0.elapsed();
        assert_code(&r, "TIMEOUT", "shell past its timeout");
        assert_eq!(out["stdout"], "started\n", "{out}");
        assert_eq!(out["timed_out"], true, "{out}");
        assert!(took < Duration::from_secs(8), "took {took:?}");
        assert_eq!(host_processes_with(&marker), Vec::<String>::new());
        // The session still works.
        let out = shell(c, &s, "echo again > after.txt && cat after.txt").await;
        assert_eq!(out["stdout"], "again\n");
        gw.stop().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shell_streams_output_live() {
    bounded(async {
        let mut gw = Gw::new("{}").await;
        let c = &mut gw.c.clone();
        let s = session(c, ALL).await;
        // The second line waits for a file the test writes only after it saw the first.
        let cmd = "echo first; while [ ! -e go ]; do sleep 0.05; done; echo second";
        let mut st = stream(
            c,
            req(&s, "shell", &json!({"command": cmd, "timeout": 20000}), 0),
        )
        .await;
        match next_event(&mut st).await {
            pb::tool_event::Event::Stdout(chunk) => {
                assert_eq!(String::from_utf8_lossy(&chunk.data), "first\n")
            }
            other => panic!("first event should be stdout, got {other:?}"),
        }
        ok(c, &s, "write_file", json!({"path": "go", "content": ""})).await;
        let (rest, r) = stream_result(&mut st).await;
        assert!(r.ok, "{r:?}");
        assert_eq!(rest, "second\n");
        let out: Value = serde_json::from_str(&r.output_json).unwrap();
        assert_eq!(out["stdout"], "first\nsecond\n");
        gw.stop().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_session_cancels_a_running_shell() {
    bounded(async {
        let mut gw = Gw::new("{}").await;
        let c = &mut gw.c.clone();
        let s = session(c, ALL).await;
        let marker = unique("shcl");
        let cmd = format!(
            "M={marker}; (exec -a $M-bg sleep 1000) & setsid bash -c \"exec -a $M-sid sleep 1000\" & echo ready; exec -a $M-fg sleep 1000"
        );
        let mut st = stream(c, req(&s, "shell", &json!({"command": cmd, "timeout": 60000}), 0)).await;
        match next_event(&mut st).await {
            pb::tool_event::Event::Stdout(chunk) => {
                assert_eq!(String::from_utf8_lossy(&chunk.data), "ready\n")
            }
            other => panic!("first event should be stdout, got {other:?}"),
        }
        // Every process of it exists before the close (else "none survives" is vacuous).
        for p in ["bg", "sid", "fg"] {
            let m = format!("{marker}-{p}");
            wait_until(&format!("process {m}"), Duration::from_secs(15), || {
                !host_processes_with(&m).is_empty()
            })
            .await;
        }
        let closed = close(c, &s).await.unwrap();
        assert_eq!(closed.calls_cancelled, 1, "{closed:?}");
        let (_, r) = stream_result(&mut st).await;
        assert_code(&r, "CANCELLED", "shell in a closed session");
        assert_eq!(host_processes_with(&marker), Vec::<String>::new());
        assert_session_gone(&gw, &s);
        gw.stop().await;
    })
    .await
}

// ---------------------------------------------------------------- 5. approvals

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approvals_deny_approve_and_decide_once() {
    bounded(async {
        let mut gw = Gw::new("{}").await;
        let c = &mut gw.c.clone();
        let s = session(c, UNSPECIFIED).await;
        assert_eq!(get(c, &s).await.unwrap().approval_mode, SAFE as i32);
        let host = gw.ws(&s);
        // A new file: no approval in mode safe; reads never ask.
        ok(
            c,
            &s,
            "write_file",
            json!({"path": "f.txt", "content": "keep"}),
        )
        .await;
        ok(c, &s, "read_file", json!({"path": "f.txt"})).await;
        ok(c, &s, "glob", json!({"pattern": "*"})).await;

        // delete_file waits; ListApprovals shows it; a denial carries the message.
        let r = req(&s, "delete_file", &json!({"path": "f.txt"}), 0);
        let call_id = r.call_id.clone();
        let pending = spawn_call(c, r);
        let a = wait_approval(c, &s, &[]).await;
        assert_eq!(a.tool, "delete_file");
        assert_eq!(a.session_id, s);
        assert_eq!(a.call_id, call_id);
        assert_eq!(kind(&a), pb::ApprovalKind::Destructive);
        assert!(
            a.approval_id.starts_with("ap-") && a.approval_id.len() == 35,
            "{a:?}"
        );
        assert!(
            a.arguments_json.contains("f.txt") && !a.reason.is_empty(),
            "{a:?}"
        );
        assert!(a.expires_at_ms > a.requested_at_ms);
        // Filtered by session.
        let other = session(c, SAFE).await;
        assert!(approvals(c, &other).await.is_empty());
        assert!(
            approvals(c, "")
                .await
                .iter()
                .any(|x| x.approval_id == a.approval_id)
        );
        // Nothing ran while it waits.
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(host.join("f.txt").exists());
        assert!(!pending.is_finished());
        let d = decide(c, &a.approval_id, false, "", "not now, please")
            .await
            .unwrap();
        assert!(!d.approved);
        let (r, _) = join(pending).await;
        assert_code(&r, "APPROVAL_DENIED", "denied delete");
        assert!(message(&r).contains("not now, please"), "{r:?}");
        assert!(host.join("f.txt").exists());
        let e = decide(c, &a.approval_id, true, "", "").await.unwrap_err();
        assert_eq!(e.code(), Code::NotFound, "a second decision: {e:?}");
        assert!(approvals(c, &s).await.is_empty());

        // StreamTool: the first event is the approval; approved, the call runs.
        let mut st = stream(c, req(&s, "delete_file", &json!({"path": "f.txt"}), 0)).await;
        let a = match next_event(&mut st).await {
            pb::tool_event::Event::Approval(a) => a,
            other => panic!("first event should be the approval, got {other:?}"),
        };
        assert_eq!(kind(&a), pb::ApprovalKind::Destructive);
        assert_eq!(approvals(c, &s).await[0].approval_id, a.approval_id);
        assert!(host.join("f.txt").exists());
        let d = decide(c, &a.approval_id, true, "", "").await.unwrap();
        assert!(d.approved);
        let (_, r) = stream_result(&mut st).await;
        assert!(r.ok, "{r:?}");
        assert!(!host.join("f.txt").exists());
        // Decided twice, approve or deny: NOT_FOUND; an unknown id too.
        for approve in [true, false] {
            let e = decide(c, &a.approval_id, approve, "", "")
                .await
                .unwrap_err();
            assert_eq!(e.code(), Code::NotFound, "{e:?}");
        }
        let e = decide(c, "ap-00000000000000000000000000000000", true, "", "")
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::NotFound, "{e:?}");

        // Overwriting asks (destructive); shell asks (execute); edit asks (write).
        ok(
            c,
            &s,
            "write_file",
            json!({"path": "w.txt", "content": "old"}),
        )
        .await;
        for (tool, args, want) in [
            (
                "write_file",
                json!({"path": "w.txt", "content": "new"}),
                pb::ApprovalKind::Destructive,
            ),
            (
                "shell",
                json!({"command": "echo hi > w.txt"}),
                pb::ApprovalKind::Execute,
            ),
            (
                "edit",
                json!({"path": "w.txt", "old_string": "old", "new_string": "new"}),
                pb::ApprovalKind::Write,
            ),
            (
                "run_code",
                json!({"language": "bash", "code": "echo hi > w.txt"}),
                pb::ApprovalKind::Execute,
            ),
        ] {
            let pending = spawn_call(c, req(&s, tool, &args, 0));
            let a = wait_approval(c, &s, &[]).await;
            assert_eq!((a.tool.as_str(), kind(&a)), (tool, want), "{a:?}");
            if tool == "write_file" || tool == "edit" {
                assert!(a.reason.contains("new"), "a diff preview: {a:?}");
            }
            assert_eq!(std::fs::read_to_string(host.join("w.txt")).unwrap(), "old");
            decide(c, &a.approval_id, false, "", "no").await.unwrap();
            let (r, _) = join(pending).await;
            assert_code(&r, "APPROVAL_DENIED", tool);
            assert_eq!(std::fs::read_to_string(host.join("w.txt")).unwrap(), "old");
        }
        gw.stop().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_decision_before_the_caller_deadline_is_approval_required() {
    bounded(async {
        let mut gw = Gw::new("{}").await;
        let c = &mut gw.c.clone();
        let s = session(c, SAFE).await;
        ok(
            c,
            &s,
            "write_file",
            json!({"path": "f.txt", "content": "keep"}),
        )
        .await;
        let t0 = Instant::now();
        let pending = spawn_call(c, req(&s, "delete_file", &json!({"path": "f.txt"}), 1500));
        let a = wait_approval(c, &s, &[]).await;
        let (r, _) = join(pending).await;
        let took = t0.elapsed();
        assert_code(&r, "APPROVAL_REQUIRED", "no decision within timeout_ms");
        assert!(
            took >= Duration::from_millis(1400) && took < Duration::from_secs(6),
            "took {took:?}"
        );
        assert!(
            approvals(c, &s).await.is_empty(),
            "the approval is withdrawn"
        );
        let e = decide(c, &a.approval_id, true, "", "").await.unwrap_err();
        assert_eq!(e.code(), Code::NotFound, "{e:?}");
        assert!(gw.ws(&s).join("f.txt").exists());
        gw.stop().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approval_timeout_config_is_approval_required() {
    bounded(async {
        let mut gw = Gw::new("sessions:\n  approval_timeout_seconds: 1\n").await;
        let c = &mut gw.c.clone();
        let s = session(c, SAFE).await;
        ok(
            c,
            &s,
            "write_file",
            json!({"path": "f.txt", "content": "keep"}),
        )
        .await;
        let t0 = Instant::now();
        let (r, _) = call(c, &s, "delete_file", json!({"path": "f.txt"})).await;
        let took = t0.elapsed();
        assert_code(
            &r,
            "APPROVAL_REQUIRED",
            "no decision within approval_timeout_seconds",
        );
        assert!(
            took >= Duration::from_millis(900) && took < Duration::from_secs(6),
            "took {took:?}"
        );
        assert!(approvals(c, &s).await.is_empty());
        assert!(gw.ws(&s).join("f.txt").exists());
        gw.stop().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approved_with_modified_arguments() {
    bounded(async {
        let mut gw = Gw::new("{}").await;
        let c = &mut gw.c.clone();
        let s = session(c, SAFE).await;
        let host = gw.ws(&s);
        ok(
            c,
            &s,
            "write_file",
            json!({"path": "e.txt", "content": "hello world\n"}),
        )
        .await;

        // edit approved with other arguments: runs with them, and says so.
        let pending = spawn_call(
            c,
            req(
                &s,
                "edit",
                &json!({"path": "e.txt", "old_string": "world", "new_string": "there"}),
                0,
            ),
        );
        let a = wait_approval(c, &s, &[]).await;
        assert_eq!(kind(&a), pb::ApprovalKind::Write);
        // Modified arguments that break the schema: refused, still pending.
        for bad in [
            r#"{"path": 5}"#,
            r#"{"path":"e.txt"}"#,
            "not json",
            r#"{"path":"e.txt","old_string":"a","new_string":"b","extra":1}"#,
        ] {
            let e = decide(c, &a.approval_id, true, bad, "").await.unwrap_err();
            assert_eq!(e.code(), Code::InvalidArgument, "{bad}: {e:?}");
        }
        assert_eq!(approvals(c, &s).await.len(), 1, "still pending");
        assert!(!pending.is_finished());
        assert_eq!(
            std::fs::read_to_string(host.join("e.txt")).unwrap(),
            "hello world\n"
        );
        let modified = json!({"path": "e.txt", "old_string": "world", "new_string": "moon"});
        decide(c, &a.approval_id, true, &modified.to_string(), "use moon")
            .await
            .unwrap();
        let (r, out) = join(pending).await;
        assert!(r.ok, "{r:?}");
        assert_eq!(out["approval"]["argumentsModified"], true, "{out}");
        assert_eq!(out["approval"]["arguments"], modified, "{out}");
        assert_eq!(
            out["approval"]["approvalId"],
            a.approval_id.as_str(),
            "{out}"
        );
        assert_eq!(
            std::fs::read_to_string(host.join("e.txt")).unwrap(),
            "hello moon\n"
        );

        // Modified arguments pointing outside the workspace: INVALID_PATH, nothing outside
        // changed (case 48).
        let passwd = std::fs::read("/etc/passwd").unwrap();
        let outside = gw.state.join("workspaces").join("x");
        for (tool, asked, modified) in [
            (
                "edit",
                json!({"path": "e.txt", "old_string": "moon", "new_string": "sun"}),
                json!({"path": "/etc/passwd", "old_string": "root", "new_string": "toor"}),
            ),
            (
                "edit",
                json!({"path": "e.txt", "old_string": "moon", "new_string": "sun"}),
                json!({"path": "../x", "old_string": "a", "new_string": "b"}),
            ),
            (
                "delete_file",
                json!({"path": "e.txt"}),
                json!({"path": "/etc/passwd"}),
            ),
            (
                "write_file",
                json!({"path": "e.txt", "content": "over"}),
                json!({"path": "../x", "content": "escaped"}),
            ),
            (
                "write_file",
                json!({"path": "e.txt", "content": "over"}),
                json!({"path": "/etc/passwd", "content": "escaped"}),
            ),
            (
                "move_file",
                json!({"from": "e.txt", "to": "e.txt", "overwrite": true}),
                json!({"from": "e.txt", "to": "../x", "overwrite": true}),
            ),
        ] {
            let pending = spawn_call(c, req(&s, tool, &asked, 0));
            let a = wait_approval(c, &s, &[]).await;
            decide(c, &a.approval_id, true, &modified.to_string(), "")
                .await
                .unwrap();
            let (r, _) = join(pending).await;
            assert_code(
                &r,
                "INVALID_PATH",
                &format!("{tool} modified to {modified}"),
            );
            assert!(approvals(c, &s).await.is_empty());
            assert_eq!(std::fs::read("/etc/passwd").unwrap(), passwd);
            assert!(!outside.exists(), "{outside:?} was written");
            assert_eq!(
                std::fs::read_to_string(host.join("e.txt")).unwrap(),
                "hello moon\n"
            );
        }
        gw.stop().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mode_none_asks_everything_and_a_stronger_change_asks_again() {
    bounded(async {
        let mut gw = Gw::new("{}").await;
        let c = &mut gw.c.clone();
        let s = session(c, NONE).await;
        let host = gw.ws(&s);

        // Even a new file and a read ask in mode none.
        let pending = spawn_call(
            c,
            req(
                &s,
                "write_file",
                &json!({"path": "existing.txt", "content": "original"}),
                0,
            ),
        );
        let a = wait_approval(c, &s, &[]).await;
        assert_eq!(kind(&a), pb::ApprovalKind::Write, "{a:?}");
        assert!(
            !host.join("existing.txt").exists(),
            "ran before its decision"
        );
        decide(c, &a.approval_id, true, "", "").await.unwrap();
        assert!(join(pending).await.0.ok);
        let pending = spawn_call(c, req(&s, "read_file", &json!({"path": "existing.txt"}), 0));
        let a = wait_approval(c, &s, &[]).await;
        assert_eq!(
            (a.tool.as_str(), kind(&a)),
            ("read_file", pb::ApprovalKind::Read)
        );
        decide(c, &a.approval_id, true, "", "").await.unwrap();
        let (r, out) = join(pending).await;
        assert!(r.ok, "{r:?}");
        assert_eq!(out["content"], "     1\toriginal\n", "{out}");

        // A new file, approved with a path that exists: a second approval (destructive),
        // and the call runs only once that one is approved (case 48).
        let pending = spawn_call(
            c,
            req(
                &s,
                "write_file",
                &json!({"path": "new.txt", "content": "X"}),
                0,
            ),
        );
        let first = wait_approval(c, &s, &[]).await;
        assert_eq!(kind(&first), pb::ApprovalKind::Write);
        let modified = json!({"path": "existing.txt", "content": "X"});
        decide(c, &first.approval_id, true, &modified.to_string(), "")
            .await
            .unwrap();
        let second = wait_approval(c, &s, std::slice::from_ref(&first.approval_id)).await;
        assert_ne!(second.approval_id, first.approval_id);
        assert_eq!(kind(&second), pb::ApprovalKind::Destructive, "{second:?}");
        assert_eq!(
            serde_json::from_str::<Value>(&second.arguments_json).unwrap(),
            modified
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!pending.is_finished(), "ran before the second approval");
        assert_eq!(
            std::fs::read_to_string(host.join("existing.txt")).unwrap(),
            "original"
        );
        assert!(!host.join("new.txt").exists());
        // The first approval cannot be decided again.
        let e = decide(c, &first.approval_id, true, "", "")
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::NotFound);
        decide(c, &second.approval_id, true, "", "").await.unwrap();
        let (r, out) = join(pending).await;
        assert!(r.ok, "{r:?}");
        assert_eq!(out["approval"]["argumentsModified"], true, "{out}");
        assert_eq!(
            std::fs::read_to_string(host.join("existing.txt")).unwrap(),
            "X"
        );
        assert!(!host.join("new.txt").exists());

        // Denying the second approval: nothing runs.
        let pending = spawn_call(
            c,
            req(
                &s,
                "write_file",
                &json!({"path": "new2.txt", "content": "Y"}),
                0,
            ),
        );
        let first = wait_approval(c, &s, &[]).await;
        decide(
            c,
            &first.approval_id,
            true,
            &json!({"path": "existing.txt", "content": "Y"}).to_string(),
            "",
        )
        .await
        .unwrap();
        let second = wait_approval(c, &s, std::slice::from_ref(&first.approval_id)).await;
        decide(c, &second.approval_id, false, "", "keep it")
            .await
            .unwrap();
        let (r, _) = join(pending).await;
        assert_code(&r, "APPROVAL_DENIED", "second approval denied");
        assert_eq!(
            std::fs::read_to_string(host.join("existing.txt")).unwrap(),
            "X"
        );
        gw.stop().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_approvals_streams_new_ones_and_mode_all_asks_nothing() {
    bounded(async {
        let mut gw = Gw::new("{}").await;
        let c = &mut gw.c.clone();
        let s = session(c, SAFE).await;
        let mut watch = within(
            "WatchApprovals",
            c.watch_approvals(pb::WatchApprovalsRequest {
                session_id: s.clone(),
            }),
        )
        .await
        .unwrap()
        .into_inner();
        ok(
            c,
            &s,
            "write_file",
            json!({"path": "f.txt", "content": "x"}),
        )
        .await;
        let pending = spawn_call(c, req(&s, "delete_file", &json!({"path": "f.txt"}), 0));
        let seen = within("watched approval", watch.message())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(seen.tool, "delete_file");
        assert_eq!(seen.session_id, s);
        assert_eq!(approvals(c, &s).await[0].approval_id, seen.approval_id);
        decide(c, &seen.approval_id, true, "", "").await.unwrap();
        assert!(join(pending).await.0.ok);

        // Mode all: destructive calls run at once, nothing is asked.
        let all = session(c, ALL).await;
        ok(
            c,
            &all,
            "write_file",
            json!({"path": "f.txt", "content": "x"}),
        )
        .await;
        ok(
            c,
            &all,
            "write_file",
            json!({"path": "f.txt", "content": "y"}),
        )
        .await;
        ok(
            c,
            &all,
            "edit",
            json!({"path": "f.txt", "old_string": "y", "new_string": "z"}),
        )
        .await;
        shell(c, &all, "true").await;
        ok(c, &all, "delete_file", json!({"path": "f.txt"})).await;
        assert!(approvals(c, &all).await.is_empty());
        gw.stop().await;
    })
    .await
}

// ---------------------------------------------------------------- 6. security

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn case40_symlinks_out_of_the_workspace() {
    bounded(async {
        let mut gw = Gw::new("{}").await;
        let c = &mut gw.c.clone();
        let a = session(c, ALL).await;
        let b = session(c, ALL).await;
        ok(
            c,
            &b,
            "write_file",
            json!({"path": "secret-B.txt", "content": "B-secret"}),
        )
        .await;
        let b_host = gw.ws(&b);
        let b_secret = b_host.join("secret-B.txt");
        let passwd = std::fs::read("/etc/passwd").unwrap();
        let hostname = std::fs::read("/etc/hostname").ok();
        shell(
            c,
            &a,
            &format!(
                "ln -s /etc/passwd p && ln -s / root && ln -s /proc/self/root pr && \
                 ln -s {bh} other && ln -s {bh}/secret-B.txt otherf && ln -s /etc etc && \
                 mkdir d && echo normal > normal.txt && echo normal > d/n.txt",
                bh = b_host.display()
            ),
        )
        .await;
        let unchanged = |what: &str| {
            assert_eq!(
                std::fs::read("/etc/passwd").unwrap(),
                passwd,
                "{what}: /etc/passwd changed"
            );
            assert_eq!(
                std::fs::read_to_string(&b_secret).unwrap(),
                "B-secret",
                "{what}: B's file changed"
            );
            assert_eq!(
                std::fs::read("/etc/hostname").ok(),
                hostname,
                "{what}: /etc/hostname changed"
            );
            let b_files: Vec<_> = std::fs::read_dir(&b_host)
                .unwrap()
                .flatten()
                .map(|e| e.file_name())
                .collect();
            assert_eq!(
                b_files.len(),
                1,
                "{what}: B's workspace now holds {b_files:?}"
            );
        };

        // Control: the same calls on normal files work.
        assert_eq!(
            ok(c, &a, "read_file", json!({"path": "normal.txt"})).await["content"],
            "     1\tnormal\n"
        );
        ok(c, &a, "list_directory", json!({"path": "d"})).await;
        ok(c, &a, "glob", json!({"pattern": "*.txt", "path": "d"})).await;

        let through = [
            "p",
            "root/etc/passwd",
            "pr/etc/passwd",
            "otherf",
            "other/secret-B.txt",
            "etc/passwd",
        ];
        for path in through {
            let (r, out) = call(c, &a, "read_file", json!({ "path": path })).await;
            assert_code(&r, "INVALID_PATH", &format!("read_file {path}"));
            assert!(!out.to_string().contains("root:") && !out.to_string().contains("B-secret"));
            let (r, _) = call(
                c,
                &a,
                "edit",
                json!({"path": path, "old_string": "root", "new_string": "toor"}),
            )
            .await;
            assert_code(&r, "INVALID_PATH", &format!("edit {path}"));
            let (r, _) = call(
                c,
                &a,
                "edit",
                json!({"path": path, "old_string": "B-secret", "new_string": "stolen"}),
            )
            .await;
            assert_code(&r, "INVALID_PATH", &format!("edit {path}"));
            unchanged(&format!("edit {path}"));
        }
        // Paths through a symlinked directory: refused for every tool.
        for path in [
            "root/etc/passwd",
            "pr/etc/passwd",
            "other/secret-B.txt",
            "etc/passwd",
            "other/new.txt",
            "root/tmp/x",
        ] {
            let (r, _) = call(
                c,
                &a,
                "write_file",
                json!({"path": path, "content": "pwned", "createDirs": true}),
            )
            .await;
            assert_code(&r, "INVALID_PATH", &format!("write_file {path}"));
            let (r, _) = call(c, &a, "delete_file", json!({"path": path})).await;
            assert!(code(&r) == "INVALID_PATH", "delete_file {path}: {r:?}");
            let (r, _) = call(c, &a, "move_file", json!({"from": path, "to": "moved"})).await;
            assert_code(&r, "INVALID_PATH", &format!("move_file from {path}"));
            let (r, _) = call(
                c,
                &a,
                "move_file",
                json!({"from": "normal.txt", "to": path, "overwrite": true}),
            )
            .await;
            assert_code(&r, "INVALID_PATH", &format!("move_file to {path}"));
            unchanged(path);
        }
        for dir in ["root", "pr", "other", "etc", "root/etc", "pr/etc"] {
            let (r, _) = call(c, &a, "list_directory", json!({ "path": dir })).await;
            assert_code(&r, "INVALID_PATH", &format!("list_directory {dir}"));
            let (r, _) = call(c, &a, "glob", json!({"pattern": "*", "path": dir})).await;
            assert_code(&r, "INVALID_PATH", &format!("glob in {dir}"));
        }
        // Walks from the root never follow the links out.
        let out = ok(c, &a, "glob", json!({"pattern": "**/*"})).await;
        let files = out["files"].to_string();
        assert!(
            !files.contains("passwd") && !files.contains("secret-B") && !files.contains("hostname"),
            "{out}"
        );
        let out = ok(
            c,
            &a,
            "list_directory",
            json!({"path": ".", "recursive": true}),
        )
        .await;
        let listed = out["entries"].to_string();
        assert!(
            !listed.contains("passwd") && !listed.contains("secret-B"),
            "{out}"
        );

        // On the link itself: write_file replaces the link, delete_file and move_file act
        // on the link; the targets stay as they were.
        let (r, _) = call(c, &a, "write_file", json!({"path": "p", "content": "mine"})).await;
        assert!(code(&r) == "INVALID_PATH" || r.ok, "{r:?}");
        unchanged("write_file p");
        let (r, _) = call(
            c,
            &a,
            "write_file",
            json!({"path": "otherf", "content": "mine"}),
        )
        .await;
        assert!(code(&r) == "INVALID_PATH" || r.ok, "{r:?}");
        unchanged("write_file otherf");
        let (r, _) = call(c, &a, "move_file", json!({"from": "other", "to": "stolen"})).await;
        assert!(code(&r) == "INVALID_PATH" || r.ok, "{r:?}");
        unchanged("move_file other");
        assert!(b_host.is_dir());
        for link in ["root", "pr", "etc", "stolen", "other"] {
            let (r, _) = call(
                c,
                &a,
                "delete_file",
                json!({"path": link, "recursive": true}),
            )
            .await;
            assert!(
                matches!(code(&r).as_str(), "INVALID_PATH" | "OK" | "FILE_NOT_FOUND"),
                "{link}: {r:?}"
            );
            unchanged(&format!("delete_file {link}"));
        }
        assert!(std::path::Path::new("/etc/passwd").is_file());
        assert!(b_secret.is_file());
        // Control: the tools still work on normal files.
        ok(
            c,
            &a,
            "move_file",
            json!({"from": "normal.txt", "to": "moved.txt"}),
        )
        .await;
        ok(c, &a, "delete_file", json!({"path": "moved.txt"})).await;
        // grep: a control, then through the links (made again: some were replaced above).
        shell(
            c,
            &a,
            &format!(
                "rm -f p root pr other otherf etc stolen && ln -s /etc/passwd p && ln -s / root && \
                 ln -s /proc/self/root pr && ln -s {bh} other && ln -s {bh}/secret-B.txt otherf && \
                 ln -s /etc etc",
                bh = b_host.display()
            ),
        )
        .await;
        let out = ok(c, &a, "grep", json!({"pattern": "normal", "path": "d"})).await;
        assert_eq!(out["matchCount"], 1, "{out}");
        for dir in ["root", "pr", "other", "etc", "root/etc", "pr/etc"] {
            let (r, out) = call(
                c,
                &a,
                "grep",
                json!({"pattern": "root|B-secret", "path": dir}),
            )
            .await;
            assert!(
                code(&r) == "INVALID_PATH" || out["matchCount"] == 0,
                "grep in {dir}: {r:?}"
            );
        }
        let out = ok(
            c,
            &a,
            "grep",
            json!({"pattern": "root:|B-secret", "path": "."}),
        )
        .await;
        assert_eq!(out["matchCount"], 0, "{out}");
        gw.stop().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn case42_fifo_is_refused_at_once() {
    bounded(async {
        let mut gw = Gw::new("{}").await;
        let c = &mut gw.c.clone();
        let s = session(c, ALL).await;
        shell(
            c,
            &s,
            "mkfifo p && mkfifo sub_p && echo hit > t.txt && [ -p p ]",
        )
        .await;
        let t0 = Instant::now();
        let (r, _) = call(c, &s, "read_file", json!({"path": "p"})).await;
        assert_code(&r, "PERMISSION_DENIED", "read_file of a FIFO");
        assert!(message(&r).contains("FIFO"), "{r:?}");
        assert!(
            t0.elapsed() < Duration::from_secs(2),
            "read_file of a FIFO took {:?}",
            t0.elapsed()
        );
        let t0 = Instant::now();
        let (r, out) = call(c, &s, "grep", json!({"pattern": "hit", "path": "p"})).await;
        assert!(
            t0.elapsed() < Duration::from_secs(2),
            "grep of a FIFO took {:?}",
            t0.elapsed()
        );
        assert!(
            code(&r) == "PERMISSION_DENIED" || (r.ok && out["matchCount"] == 0),
            "grep of a FIFO: {r:?}"
        );
        let t0 = Instant::now();
        let (r, _) = call(
            c,
            &s,
            "edit",
            json!({"path": "p", "old_string": "a", "new_string": "b"}),
        )
        .await;
        assert_code(&r, "PERMISSION_DENIED", "edit of a FIFO");
        assert!(
            t0.elapsed() < Duration::from_secs(2),
            "edit of a FIFO took {:?}",
            t0.elapsed()
        );
        let t0 = Instant::now();
        let out = ok(c, &s, "grep", json!({"pattern": "hit", "path": "."})).await;
        assert!(
            t0.elapsed() < Duration::from_secs(2),
            "grep took {:?}",
            t0.elapsed()
        );
        assert_eq!(out["rendered"], "t.txt:1: hit\n", "{out}");
        gw.stop().await;
    })
    .await
}

fn allocated_bytes(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0;
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let m = e.metadata().unwrap();
        if m.is_file() {
            total += m.blocks() * 512;
        }
    }
    total
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn case44_a_full_workspace_is_quota_exceeded_and_enospc() {
    bounded(async {
        let mut gw =
            Gw::new("sessions:\n  workspace_size_mb: 16\n  workspace_max_files: 4096\n").await;
        let c = &mut gw.c.clone();
        let s = session(c, ALL).await;
        let other = session(c, ALL).await;
        let ten_mib = "a".repeat(10 << 20);
        ok(
            c,
            &s,
            "write_file",
            json!({"path": "one", "content": ten_mib}),
        )
        .await;
        let (r, _) = call(
            c,
            &s,
            "write_file",
            json!({"path": "two", "content": ten_mib}),
        )
        .await;
        assert_code(&r, "QUOTA_EXCEEDED", "a second 10 MiB file in 16 MiB");
        drop(ten_mib);
        // A failed write leaves no partial file behind.
        let listed = ok(
            c,
            &s,
            "list_directory",
            json!({"path": ".", "includeHidden": true}),
        )
        .await;
        assert_eq!(listed["entries"].as_array().unwrap().len(), 1, "{listed}");

        let (r, out) = call(
            c,
            &s,
            "shell",
            json!({"command": "dd if=/dev/zero of=big bs=1M count=64"}),
        )
        .await;
        assert!(!r.ok, "{r:?}");
        assert_ne!(out["exit_code"], 0, "{out}");
        assert!(
            out["stderr"].as_str().unwrap().contains("No space left"),
            "{out}"
        );

        // The host holds no more than the workspace's size for it.
        let imgs = allocated_bytes(&gw.state.join("workspaces"));
        assert!(imgs <= 17 << 20, "images take {imgs} bytes on the host");
        let used = get(c, &s).await.unwrap();
        assert!(used.workspace_bytes_limit <= 16 << 20, "{used:?}");

        // The other session is unaffected; the full one recovers once a file goes.
        ok(
            c,
            &other,
            "write_file",
            json!({"path": "fine.txt", "content": "x".repeat(1 << 20)}),
        )
        .await;
        shell(
            c,
            &other,
            "dd if=/dev/zero of=more bs=1M count=4 2>/dev/null",
        )
        .await;
        shell(c, &s, "rm big").await;
        ok(
            c,
            &s,
            "write_file",
            json!({"path": "small", "content": "ok"}),
        )
        .await;
        gw.stop().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn case45_46_hard_links_and_other_sessions_are_out_of_reach() {
    bounded(async {
        let mut gw = Gw::new("{}").await;
        let c = &mut gw.c.clone();
        let a = session(c, ALL).await;
        let b = session(c, ALL).await;
        assert!(is_generated_id(&a) && is_generated_id(&b));

        // Case 45: a hard link to a file outside cannot be made.
        let (r, out) = call(c, &a, "shell", json!({"command": "ln /etc/hostname x"})).await;
        assert!(!r.ok, "{r:?}");
        let stderr = out["stderr"].as_str().unwrap();
        assert!(
            stderr.contains("Invalid cross-device link") || stderr.contains("Operation not permitted"),
            "{out}"
        );
        assert!(!gw.ws(&a).join("x").exists());
        // Control: a hard link inside the workspace works.
        shell(c, &a, "echo in > f && ln f g && cat g").await;
        // ...but the file tools refuse a hard-linked file (it may share its contents with
        // one outside).
        let (r, _) = call(c, &a, "read_file", json!({"path": "g"})).await;
        assert_code(&r, "PERMISSION_DENIED", "read_file of a hard-linked file");

        // Case 46: B leaves a file and a process; A sees neither.
        let file_tail = unique("t");
        let file = format!("marker-B-{file_tail}");
        let proc_marker = unique("procB");
        let cmd = format!("echo s > {file}; echo ready; exec -a {proc_marker}-$X sleep 60");
        let mut st = stream(c, req(&b, "shell", &json!({"command": format!("X=live; {cmd}"), "timeout": 60000}), 0)).await;
        match next_event(&mut st).await {
            pb::tool_event::Event::Stdout(chunk) => assert_eq!(String::from_utf8_lossy(&chunk.data), "ready\n"),
            other => panic!("{other:?}"),
        }
        let live = format!("{proc_marker}-live");
        wait_until("B's process", Duration::from_secs(15), || !host_processes_with(&live).is_empty()).await;
        assert!(gw.ws(&b).join(&file).is_file(), "the host sees B's file");
        let out = shell(
            c,
            &a,
            &format!(
                "F={file_tail}; find / -name \"marker-B-$F\" 2>/dev/null; cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '; echo; ls /proc | grep -c '^[0-9]'"
            ),
        )
        .await;
        let stdout = out["stdout"].as_str().unwrap();
        assert!(!stdout.contains(&file), "A found B's file: {out}");
        assert!(!stdout.contains(&live), "A saw B's process: {out}");
        // A's view of processes is its own (a handful at most).
        let procs: u32 = stdout.lines().last().unwrap().trim().parse().unwrap();
        assert!(procs < 10, "A sees {procs} processes: {out}");
        // Nor through the file tools.
        let b_host = gw.ws(&b).join(&file);
        for path in [
            format!("../{b}/{file}"),
            b_host.display().to_string(),
            format!("/workspace/../{b}/{file}"),
        ] {
            let (r, _) = call(c, &a, "read_file", json!({ "path": path })).await;
            assert_code(&r, "INVALID_PATH", &format!("read_file {path}"));
        }
        let (r, _) = call(c, &a, "read_file", json!({ "path": file })).await;
        assert_code(&r, "FILE_NOT_FOUND", "B's file name in A");
        let out = ok(c, &a, "glob", json!({"pattern": "**/marker-B-*"})).await;
        assert_eq!(out["count"], 0, "{out}");
        close(c, &b).await.unwrap();
        let (_, r) = stream_result(&mut st).await;
        assert_code(&r, "CANCELLED", "B's shell when B closes");
        assert_eq!(host_processes_with(&proc_marker), Vec::<String>::new());
        gw.stop().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn case49_an_expired_session_leaves_nothing() {
    bounded(async {
        let mut gw = Gw::new("{}").await;
        let c = &mut gw.c.clone();
        let s = create(c, "", ALL, 2).await.unwrap();
        assert_eq!(s.idle_timeout_seconds, 2);
        let id = s.session_id;
        let marker = unique("exp");
        // A program that left a background process would keep nothing alive either.
        shell(
            c,
            &id,
            &format!("echo x > f; (exec -a {marker} sleep 1000 &); true"),
        )
        .await;
        ok(c, &id, "write_file", json!({"path": "g", "content": "x"})).await;
        assert!(mounted(&gw.ws(&id)) && gw.image(&id).is_file() && gw.record(&id).is_file());
        // A session with a call running does not expire under it.
        let keep = create(c, "", ALL, 2).await.unwrap().session_id;
        let mut st = stream(
            c,
            req(
                &keep,
                "shell",
                &json!({"command": "echo go; sleep 6; echo done", "timeout": 30000}),
                0,
            ),
        )
        .await;
        let end = Instant::now() + Duration::from_secs(15);
        loop {
            match get(c, &id).await {
                Err(e) => {
                    assert_eq!(e.code(), Code::NotFound, "{e:?}");
                    break;
                }
                Ok(_) => {
                    assert!(
                        Instant::now() < end,
                        "the session did not expire within 15 s"
                    );
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
        let (r, _) = call(c, &id, "read_file", json!({"path": "f"})).await;
        assert_code(&r, "SESSION_NOT_FOUND", "read_file in an expired session");
        assert_session_gone(&gw, &id);
        assert_eq!(host_processes_with(&marker), Vec::<String>::new());
        // The busy session outlived its idle timeout and finished its call.
        let (stdout, r) = stream_result(&mut st).await;
        assert!(r.ok, "{r:?}");
        assert_eq!(stdout, "go\ndone\n", "streamed; the result: {r:?}");
        assert!(get(c, &keep).await.is_ok(), "expired while a call ran");
        gw.stop().await;
    })
    .await
}

// ---------------------------------------------------------------- 7. restart

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_survive_a_restart_and_expire_while_down() {
    bounded(async {
        let tmp = state_dir();
        let state = tmp.path().canonicalize().unwrap();
        let mut gw = Gw::on("{}", &state).await;
        let c = &mut gw.c.clone();
        let keep = create(c, "keep", ALL, 0).await.unwrap();
        ok(
            c,
            "keep",
            "write_file",
            json!({"path": "src/kept.txt", "content": "still here\n", "createDirs": true}),
        )
        .await;
        create(c, "short", ALL, 2).await.unwrap();
        ok(
            c,
            "short",
            "write_file",
            json!({"path": "s.txt", "content": "s"}),
        )
        .await;
        let short = get(c, "short").await.unwrap();
        assert!(mounted(&gw.ws("keep")));

        // One gateway per state dir.
        let err = match try_start("{}", Some(&state)).await {
            Ok(_) => panic!("a second gateway started on the same state dir"),
            Err(e) => e.to_string(),
        };
        assert!(err.contains("in use"), "{err}");

        gw.stop().await;
        assert!(!mounted(&gw.ws("keep")), "unmounted at shutdown");
        assert!(gw.image("keep").is_file() && gw.record("keep").is_file());
        // Let the short session's idle time run out while no gateway runs.
        let expires = std::time::UNIX_EPOCH + Duration::from_millis(get_expiry(&short) + 500);
        while std::time::SystemTime::now() < expires {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }

        let mut gw = Gw::on("{}", &state).await;
        let c = &mut gw.c.clone();
        let got = get(c, "keep").await.unwrap();
        assert_eq!(got.approval_mode, ALL as i32);
        assert_eq!(got.created_at_ms, keep.created_at_ms);
        let out = ok(c, "keep", "read_file", json!({"path": "src/kept.txt"})).await;
        assert_eq!(out["content"], "     1\tstill here\n");
        let out = shell(c, "keep", "cat src/kept.txt").await;
        assert_eq!(out["stdout"], "still here\n");
        assert_eq!(get(c, "short").await.unwrap_err().code(), Code::NotFound);
        let (r, _) = call(c, "short", "read_file", json!({"path": "s.txt"})).await;
        assert_code(&r, "SESSION_NOT_FOUND", "a session that expired while down");
        assert_session_gone(&gw, "short");
        gw.stop().await;
        drop(tmp);
    })
    .await
}

fn get_expiry(s: &pb::Session) -> u64 {
    s.expires_at_ms.max(0) as u64
}

// ---------------------------------------------------------------- 2b. grep, seed names, config

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grep_over_grpc() {
    bounded(async {
        let mut gw = Gw::new("{}").await;
        let c = &mut gw.c.clone();
        let s = session(c, ALL).await;
        ok(c, &s, "write_file", json!({"path": "dir/sub/a.txt", "content": "one\ntwo\nthree\nfour\n", "createDirs": true})).await;
        ok(c, &s, "write_file", json!({"path": "d2/b.txt", "content": "bee\n", "createDirs": true})).await;
        // A binary file that matches is skipped, never dumped.
        ok(c, &s, "write_file", json!({"path": "bin.dat", "content": "dHdvAAB0d28K", "encoding": "base64"})).await;

        // path:line: text.
        let out = ok(c, &s, "grep", json!({"pattern": "t[wh]", "path": "."})).await;
        let rendered = out["rendered"].as_str().unwrap();
        assert_eq!(rendered, "dir/sub/a.txt:2: two\ndir/sub/a.txt:3: three\n", "{out}");
        assert_eq!(out["matchCount"], 2, "{out}");
        assert_eq!(out["matches"][0]["path"], "dir/sub/a.txt", "{out}");
        assert_eq!(out["matches"][0]["line"], 2, "{out}");
        assert_eq!(out["binaryFilesSkipped"], 1, "{out}");
        let out = ok(c, &s, "grep", json!({"pattern": "BEE", "caseInsensitive": true, "glob": "*.txt"})).await;
        assert_eq!(out["rendered"], "d2/b.txt:1: bee\n", "{out}");
        let out = ok(c, &s, "grep", json!({"pattern": "e", "path": "dir", "maxResults": 1})).await;
        assert_eq!(out["matchCount"], 1, "{out}");
        assert_eq!(out["truncated"], true, "{out}");
        let (r, _) = call(c, &s, "grep", json!({"pattern": "(", "path": "."})).await;
        assert!(!r.ok, "{r:?}");
        let (r, _) = call(c, &s, "grep", json!({"pattern": "x", "path": "../.."})).await;
        assert_code(&r, "INVALID_PATH", "grep outside the workspace");
        gw.stop().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_file_accepts_seed_001_create_directories() {
    bounded(async {
        let mut gw = Gw::new("{}").await;
        let c = &mut gw.c.clone();
        let s = session(c, ALL).await;
        // DESIGN.md "Session tool arguments": seed 001's `createDirectories` accepted too.
        ok(
            c,
            &s,
            "write_file",
            json!({"path": "/workspace/d2/b.txt", "content": "bee\n", "createDirectories": true}),
        )
        .await;
        assert_eq!(
            std::fs::read_to_string(gw.ws(&s).join("d2/b.txt")).unwrap(),
            "bee\n"
        );
        gw.stop().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_smallest_workspace_size_works_with_the_default_file_cap() {
    bounded(async {
        // workspace_size_mb's minimum (16) is valid configuration; with the default
        // workspace_max_files it must either be refused at start (naming the keys) or make
        // workspaces, never pass validation and then fail every CreateSession.
        let tmp = state_dir();
        match try_start("sessions:\n  workspace_size_mb: 16\n", Some(tmp.path())).await {
            Err(e) => {
                let e = e.to_string();
                assert!(e.contains("sessions.workspace"), "{e}");
            }
            Ok(running) => {
                let mut c = connect(&running).await;
                let r = create(&mut c, "", ALL, 0).await;
                running.shutdown();
                let _ = within("server shutdown", running.wait()).await;
                let s = r.expect("CreateSession with workspace_size_mb: 16");
                assert!(s.workspace_bytes_limit <= 16 << 20, "{s:?}");
            }
        }
    })
    .await
}

// ---------------------------------------------------------------- ephemeral state, 41, 43

/// Mount points in this process's mount table whose path ends with `suffix`.
fn mounts_ending_with(suffix: &str) -> Vec<PathBuf> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|mp| mp.ends_with(suffix))
        .map(PathBuf::from)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_state_dir_everything_goes_at_shutdown() {
    bounded(async {
        let running = within("server start", try_start("{}", None))
            .await
            .expect("gateway starts");
        let mut c = connect(&running).await;
        let s = session(&mut c, ALL).await;
        ok(
            &mut c,
            &s,
            "write_file",
            json!({"path": "f", "content": "x"}),
        )
        .await;
        let mounts = mounts_ending_with(&format!("/workspaces/{s}"));
        assert_eq!(mounts.len(), 1, "{mounts:?}");
        let state = mounts[0].parent().unwrap().parent().unwrap().to_path_buf();
        assert!(state.join("sessions").join(format!("{s}.json")).is_file());
        running.shutdown();
        within("server shutdown", running.wait()).await.unwrap();
        assert!(!mounted(&mounts[0]), "still mounted after shutdown");
        assert!(!state.exists(), "temporary state dir {state:?} left");
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn case41_a_directory_swapped_for_a_symlink_in_a_loop() {
    bounded(async {
        let mut gw = Gw::new("{}").await;
        let c = &mut gw.c.clone();
        let s = session(c, ALL).await;
        let passwd = std::fs::read("/etc/passwd").unwrap();
        let hostname = std::fs::read("/etc/hostname").ok();
        ok(
            c,
            &s,
            "write_file",
            json!({"path": "d/passwd", "content": "inner\n", "createDirs": true}),
        )
        .await;
        // The program swaps d for a symlink to /etc (the host's /etc, as the gateway would
        // see it) as fast as it can, while the file tools work on d/...
        let cmd = "echo go; while :; do mv d d.real; ln -s /etc d; rm d; mv d.real d; done";
        let mut st = stream(
            c,
            req(&s, "shell", &json!({"command": cmd, "timeout": 5000}), 0),
        )
        .await;
        match next_event(&mut st).await {
            pb::tool_event::Event::Stdout(chunk) => {
                assert_eq!(String::from_utf8_lossy(&chunk.data), "go\n")
            }
            other => panic!("{other:?}"),
        }
        let end = Instant::now() + Duration::from_secs(3);
        let mut calls = 0;
        while Instant::now() < end {
            let (r, out) = call(c, &s, "read_file", json!({"path": "d/passwd"})).await;
            assert!(
                !out.to_string().contains("root:"),
                "read /etc/passwd: {out}"
            );
            if r.ok {
                assert_eq!(out["content"], "     1\tinner\n", "{out}");
            }
            let _ = call(
                c,
                &s,
                "write_file",
                json!({"path": "d/hostname", "content": "pwned"}),
            )
            .await;
            let _ = call(
                c,
                &s,
                "edit",
                json!({"path": "d/passwd", "old_string": "root", "new_string": "toor"}),
            )
            .await;
            let (_, out) = call(c, &s, "list_directory", json!({"path": "d"})).await;
            assert!(!out.to_string().contains("shadow"), "listed /etc: {out}");
            let _ = call(c, &s, "delete_file", json!({"path": "d/hostname"})).await;
            calls += 1;
        }
        let (_, r) = stream_result(&mut st).await;
        assert_code(&r, "TIMEOUT", "the swapping loop");
        assert!(calls > 5, "only {calls} rounds ran");
        assert_eq!(std::fs::read("/etc/passwd").unwrap(), passwd);
        assert_eq!(std::fs::read("/etc/hostname").ok(), hostname);
        gw.stop().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn case43_huge_files_answer_within_bounds() {
    bounded(async {
        let mut gw = Gw::new("{}").await;
        let c = &mut gw.c.clone();
        let s = session(c, ALL).await;
        // Programs may write 16 MiB per file (sandbox.limits.max_file_size_mb): the sparse
        // 1 TiB file is made on the host side, as another writer could.
        shell(
            c,
            &s,
            "seq 1500000 > lines && head -c 15000000 /dev/zero | tr '\\0' a > long",
        )
        .await;
        let sparse = gw.ws(&s).join("sparse");
        std::fs::File::create(&sparse)
            .unwrap()
            .set_len(1 << 40)
            .unwrap();
        std::os::unix::fs::chown(&sparse, Some(65534), Some(65534)).unwrap();
        let t0 = Instant::now();
        let out = ok(c, &s, "read_file", json!({"path": "sparse"})).await;
        assert_eq!(out["binary"], true, "{out}");
        assert!(out["content"].as_str().unwrap().len() < 1 << 20);
        let out = ok(
            c,
            &s,
            "read_file",
            json!({"path": "lines", "offset": 1499999, "limit": 5}),
        )
        .await;
        assert_eq!(
            out["content"], "1499999\t1499999\n1500000\t1500000\n",
            "{out}"
        );
        let out = ok(c, &s, "read_file", json!({"path": "lines"})).await;
        assert_eq!(out["truncated"], true, "{out}");
        assert!(out["content"].as_str().unwrap().len() <= 16 << 20);
        let out = ok(c, &s, "read_file", json!({"path": "long"})).await;
        assert_eq!(
            out["lines_truncated"]
                .as_bool()
                .or(out["linesTruncated"].as_bool()),
            Some(true),
            "{}",
            &out.to_string()[..300.min(out.to_string().len())]
        );
        assert!(out["content"].as_str().unwrap().len() < 1 << 20);
        let (r, _) = call(
            c,
            &s,
            "edit",
            json!({"path": "sparse", "old_string": "a", "new_string": "b"}),
        )
        .await;
        assert!(!r.ok, "{r:?}");
        let (r, _) = call(
            c,
            &s,
            "edit",
            json!({"path": "long", "old_string": "ab", "new_string": "b"}),
        )
        .await;
        assert!(!r.ok, "{r:?}");
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "took {:?}",
            t0.elapsed()
        );
        let out = ok(c, &s, "grep", json!({"pattern": "^1499999$", "path": "."})).await;
        assert_eq!(out["rendered"], "lines:1499999: 1499999\n", "{out}");
        gw.stop().await;
    })
    .await
}
