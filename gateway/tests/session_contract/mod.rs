//! The sessions contract: what a gRPC caller sees of sessions, their workspaces, the file
//! tools, shell, run_code in a session and approvals, whatever backend runs them (DESIGN.md
//! "Sessions and workspaces": one contract, two backends, the same suite run against both).
//!
//! Every case takes a connected [`Client`] and a [`Probe`] and asserts only what comes back
//! over gRPC, plus what the probe can see of the backend (the local backend: the host's
//! mounts, processes and files; the Kubernetes backend: nothing more than a caller). Cases
//! use fresh session ids and paths, close what they open, and wait with generous bounds, so
//! they can run in parallel against one long-lived gateway.
//!
//! Run by `gateway/tests/sessions.rs` (a local gateway per case) and by
//! `tests/e2e/tests/kubernetes.rs` (`sessions_contract::*`, the deployed gateway).

use std::future::Future;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tonic::Code;
use toolrun_proto::v1 as pb;
use toolrun_proto::v1::tool_service_client::ToolServiceClient;

/// A connected client of `toolrun.v1.ToolService`.
pub type Client = ToolServiceClient<tonic::transport::Channel>;

/// Bound of one RPC that should answer: generous, the Kubernetes backend makes a pod for a
/// session and a ToolRun for every program on a small, loaded node.
pub const RPC_BOUND: Duration = Duration::from_secs(120);

/// Bound of waiting for something the gateway does on its own (an approval to appear, a
/// session to expire).
const WAIT_BOUND: Duration = Duration::from_secs(60);

/// The workspace size both suites' gateways are configured with: the server's default
/// `sessions.workspace_size_mb` and the chart's default `sessions.workspaceSizeMiB`.
pub const WORKSPACE_SIZE: u64 = 1024 << 20;

/// What a workspace's filesystem may keep of [`WORKSPACE_SIZE`] for itself: the local
/// backend's ext4 image reports its size less its journal and inode tables (about 6% of
/// 1 GiB), a session pod its emptyDir's `sizeLimit` exactly. GetSession's limit is within
/// this much below the configured size on both.
const FS_OVERHEAD: u64 = WORKSPACE_SIZE / 10;

/// Bound of a file-tool call that must not block (a FIFO, a huge file): well under a
/// tool's own timeout, well over a relay round trip on a loaded node.
const PROMPT: Duration = Duration::from_secs(10);

/// What a backend lets the suite see beyond gRPC. Every method has a default for a backend
/// that shows nothing more (the cases then check only what a caller sees).
pub trait Probe: Sync {
    /// Processes of programs, wherever the backend runs them, whose command line contains
    /// `marker`; `None` when the backend cannot look.
    fn processes_with(&self, _marker: &str) -> Option<Vec<String>> {
        None
    }
    /// Where session `id`'s workspace is on a filesystem the gateway's side shares with
    /// other sessions (local: `<state-dir>/workspaces/<id>`); `None` when sessions share none
    /// (Kubernetes: a pod and a volume each).
    fn workspace_dir(&self, _id: &str) -> Option<PathBuf> {
        None
    }
    /// Asserts the backend holds open session `id` (local: mounted workspace, image, record).
    fn assert_open(&self, _id: &str) {}
    /// What the backend still holds of session `id` (local: its mount, workspace dir, image
    /// and record); empty once it is closed, expired or was never made.
    fn left_of(&self, _id: &str) -> Vec<String> {
        Vec::new()
    }
    /// Asserts nothing outside the workspaces changed (local: the host's /etc/passwd and
    /// /etc/hostname as they were when the probe was made, nothing new beside the
    /// workspaces); `what` names the step.
    fn assert_outside_unchanged(&self, _what: &str) {}
}

/// Invokes `$runner!(case, ...)` with every case of the contract. Each suite defines a
/// `$runner` macro that makes one test per case, so a case added here runs on both backends.
macro_rules! every_case {
    ($runner:ident) => {
        $runner!(
            lifecycle_create_get_list_close,
            every_file_tool_over_grpc,
            grep_over_grpc,
            programs_and_file_tools_see_the_same_files,
            shell_timeout_returns_partial_output_and_the_session_survives,
            shell_streams_output_live,
            close_session_cancels_a_running_shell,
            approvals_deny_approve_and_decide_once,
            no_decision_before_the_caller_deadline_is_approval_required,
            approved_with_modified_arguments,
            mode_none_asks_everything_and_a_stronger_change_asks_again,
            watch_approvals_streams_new_ones_and_mode_all_asks_nothing,
            case40_symlinks_out_of_the_workspace,
            case41_a_directory_swapped_for_a_symlink_in_a_loop,
            case42_fifo_is_refused_at_once,
            case43_huge_files_answer_within_bounds,
            case45_46_hard_links_and_other_sessions_are_out_of_reach,
            case49_an_expired_session_leaves_nothing,
        );
    };
}
pub(crate) use every_case;

// ---------------------------------------------------------------- helpers

/// Awaits `f` within [`RPC_BOUND`], naming `what` when it does not answer.
pub async fn within<F: Future>(what: &str, f: F) -> F::Output {
    tokio::time::timeout(RPC_BOUND, f)
        .await
        .unwrap_or_else(|_| panic!("{what}: no answer within {RPC_BOUND:?}"))
}

/// CreateSession.
pub async fn create(
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

/// A new session in mode `mode` with a generated id and the server's idle timeout.
pub async fn session(c: &mut Client, mode: pb::ApprovalMode) -> String {
    create(c, "", mode, 0)
        .await
        .expect("CreateSession")
        .session_id
}

/// GetSession.
pub async fn get(c: &mut Client, id: &str) -> Result<pb::Session, tonic::Status> {
    within(
        "GetSession",
        c.get_session(pb::GetSessionRequest {
            session_id: id.into(),
        }),
    )
    .await
    .map(|r| r.into_inner())
}

/// CloseSession.
pub async fn close(c: &mut Client, id: &str) -> Result<pb::CloseSessionResponse, tonic::Status> {
    within(
        "CloseSession",
        c.close_session(pb::CloseSessionRequest {
            session_id: id.into(),
        }),
    )
    .await
    .map(|r| r.into_inner())
}

/// The ids ListSessions answers.
async fn listed_ids(c: &mut Client) -> Vec<String> {
    within("ListSessions", c.list_sessions(pb::ListSessionsRequest {}))
        .await
        .expect("ListSessions")
        .into_inner()
        .sessions
        .into_iter()
        .map(|s| s.session_id)
        .collect()
}

/// Closes sessions a case opened (already gone is fine: the case may have closed them).
async fn close_all(c: &mut Client, ids: &[&str]) {
    for id in ids {
        if let Err(e) = close(c, id).await {
            assert_eq!(e.code(), Code::NotFound, "closing {id}: {e:?}");
        }
    }
}

/// A CallToolRequest in session `sid` (empty: none) with a fresh call id.
pub fn req(sid: &str, tool: &str, args: &Value, timeout_ms: u32) -> pb::CallToolRequest {
    pb::CallToolRequest {
        call_id: format!("c-{tool}-{}", uuid_like()),
        tool: tool.into(),
        arguments_json: args.to_string(),
        timeout_ms,
        session_id: sid.into(),
    }
}

/// Unique in this process and across runs against one long-lived gateway.
fn uuid_like() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!(
        "{}-{nanos:x}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// A unique marker for session ids, process and file names (letters, digits, `_`).
pub fn unique(prefix: &str) -> String {
    format!("{prefix}{}", uuid_like().replace('-', "x"))
}

fn output(res: &pb::ToolResult) -> Value {
    if res.output_json.is_empty() {
        Value::Null
    } else {
        serde_json::from_str(&res.output_json).unwrap()
    }
}

/// The result of one call and its output (Null when none).
pub async fn call_req(c: &mut Client, r: pb::CallToolRequest) -> (pb::ToolResult, Value) {
    let what = format!("CallTool {}", r.tool);
    let res = within(&what, c.call_tool(r))
        .await
        .expect("rpc ok")
        .into_inner()
        .result
        .expect("a result");
    let out = output(&res);
    (res, out)
}

/// One call in session `sid` with the tool's default timeout.
pub async fn call(c: &mut Client, sid: &str, tool: &str, args: Value) -> (pb::ToolResult, Value) {
    call_req(c, req(sid, tool, &args, 0)).await
}

/// A call that must succeed; its output.
pub async fn ok(c: &mut Client, sid: &str, tool: &str, args: Value) -> Value {
    let (r, out) = call(c, sid, tool, args.clone()).await;
    assert!(r.ok, "{tool} {args} failed: {r:?}");
    out
}

/// write_file of `content` at `path` in `sid` (the call must succeed); its output.
pub async fn write(c: &mut Client, sid: &str, path: &str, content: &str) -> Value {
    ok(
        c,
        sid,
        "write_file",
        json!({ "path": path, "content": content }),
    )
    .await
}

/// The result's error code as DESIGN.md names it (`OK` when none).
pub fn code(r: &pb::ToolResult) -> String {
    match &r.error {
        Some(e) => pb::ErrorCode::try_from(e.code)
            .map(|c| {
                c.as_str_name()
                    .trim_start_matches("ERROR_CODE_")
                    .to_string()
            })
            .unwrap_or_else(|_| format!("UNKNOWN({})", e.code)),
        None => "OK".into(),
    }
}

/// The result's error message.
pub fn message(r: &pb::ToolResult) -> String {
    r.error
        .as_ref()
        .map(|e| e.message.clone())
        .unwrap_or_default()
}

/// Asserts a failed call's code.
pub fn assert_code(r: &pb::ToolResult, want: &str, what: &str) {
    assert_eq!(code(r), want, "{what}: {r:?}");
    assert!(!r.ok, "{what}: {r:?}");
}

/// A shell command that must exit 0; its output.
pub async fn shell(c: &mut Client, sid: &str, command: &str) -> Value {
    let out = ok(c, sid, "shell", json!({ "command": command })).await;
    assert_eq!(out["exit_code"], 0, "{command}: {out}");
    out
}

/// read_file's content of `path` in `sid` (the call must succeed).
async fn content(c: &mut Client, sid: &str, path: &str) -> String {
    let out = ok(c, sid, "read_file", json!({ "path": path })).await;
    out["content"].as_str().unwrap_or_default().to_string()
}

/// Asserts read_file of `path` in `sid` is FILE_NOT_FOUND.
async fn assert_missing(c: &mut Client, sid: &str, path: &str) {
    let (r, _) = call(c, sid, "read_file", json!({ "path": path })).await;
    assert_code(&r, "FILE_NOT_FOUND", &format!("{path} in {sid}"));
}

/// StreamTool.
pub async fn stream(c: &mut Client, r: pb::CallToolRequest) -> tonic::Streaming<pb::ToolEvent> {
    within("StreamTool", c.stream_tool(r))
        .await
        .expect("StreamTool rpc")
        .into_inner()
}

/// The next event of a stream (which must not end before its result).
pub async fn next_event(s: &mut tonic::Streaming<pb::ToolEvent>) -> pb::tool_event::Event {
    within("next ToolEvent", s.message())
        .await
        .expect("stream ok")
        .expect("stream not ended")
        .event
        .expect("event set")
}

/// Asserts the next event is this stdout.
async fn expect_stdout(s: &mut tonic::Streaming<pb::ToolEvent>, want: &str) {
    match next_event(s).await {
        pb::tool_event::Event::Stdout(chunk) => {
            assert_eq!(String::from_utf8_lossy(&chunk.data), want)
        }
        other => panic!("the first event should be stdout {want:?}, got {other:?}"),
    }
}

/// Reads a stream to its result; returns the stdout seen before it and the result.
pub async fn stream_result(s: &mut tonic::Streaming<pb::ToolEvent>) -> (String, pb::ToolResult) {
    let mut stdout = String::new();
    loop {
        match next_event(s).await {
            pb::tool_event::Event::Stdout(c) => stdout.push_str(&String::from_utf8_lossy(&c.data)),
            pb::tool_event::Event::Result(r) => return (stdout, r),
            _ => {}
        }
    }
}

/// ListApprovals of `sid` (empty: every session's).
pub async fn approvals(c: &mut Client, sid: &str) -> Vec<pb::Approval> {
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

/// Waits until `sid` has a pending approval other than those in `seen`.
pub async fn wait_approval(c: &mut Client, sid: &str, seen: &[String]) -> pb::Approval {
    let end = Instant::now() + WAIT_BOUND;
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

/// DecideApproval.
pub async fn decide(
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

/// Starts a call on a clone of the client; the join handle yields its result.
pub fn spawn_call(
    c: &Client,
    r: pb::CallToolRequest,
) -> tokio::task::JoinHandle<(pb::ToolResult, Value)> {
    let mut c = c.clone();
    tokio::spawn(async move { call_req(&mut c, r).await })
}

/// The result of a spawned call.
pub async fn join<T>(h: tokio::task::JoinHandle<T>) -> T {
    within("spawned call", h).await.expect("call task")
}

fn kind(a: &pb::Approval) -> pb::ApprovalKind {
    pb::ApprovalKind::try_from(a.kind).unwrap()
}

/// read_file of `path` in `sid`, whose mode asks for reads: approves the read (and only it:
/// approvals in `pending` are left alone) and returns its result.
async fn approved_read(
    c: &mut Client,
    sid: &str,
    path: &str,
    pending: &[String],
) -> (pb::ToolResult, Value) {
    let call = spawn_call(c, req(sid, "read_file", &json!({ "path": path }), 0));
    let a = wait_approval(c, sid, pending).await;
    assert_eq!(a.tool, "read_file", "{a:?}");
    decide(c, &a.approval_id, true, "", "").await.unwrap();
    join(call).await
}

/// Waits until the probe sees a process with `marker` (at once when it cannot look).
async fn wait_process(p: &dyn Probe, marker: &str) {
    let end = Instant::now() + WAIT_BOUND;
    while p.processes_with(marker).is_some_and(|v| v.is_empty()) {
        assert!(
            Instant::now() < end,
            "no process {marker} within {WAIT_BOUND:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// How long the processes of a killed run may take to be gone: a kill is asynchronous (the
/// kernel tears a PID namespace down after its init died), a survivor stays.
const KILL_BOUND: Duration = Duration::from_secs(10);

/// Waits until the probe sees no process with `marker` (at once when it cannot look).
async fn wait_no_process(p: &dyn Probe, marker: &str) {
    let end = Instant::now() + KILL_BOUND;
    while let Some(found) = p.processes_with(marker).filter(|v| !v.is_empty()) {
        assert!(
            Instant::now() < end,
            "processes of {marker} survive {KILL_BOUND:?}: {found:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Asserts the backend holds nothing of session `id` (CloseSession answers once it is
/// cleaned up).
fn assert_gone(p: &dyn Probe, id: &str) {
    assert_eq!(p.left_of(id), Vec::<String>::new(), "{id} is not gone");
}

/// Waits until the backend holds nothing of session `id` (an expiry cleans up after the
/// session has left the gateway's table).
async fn wait_gone(p: &dyn Probe, id: &str) {
    let end = Instant::now() + WAIT_BOUND;
    while !p.left_of(id).is_empty() {
        assert!(Instant::now() < end, "{id} left {:?}", p.left_of(id));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A generated session id: `s-` and 128 random bits in hex.
pub fn is_generated_id(id: &str) -> bool {
    id.len() == 34
        && id.starts_with("s-")
        && id[2..]
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// The names of the entries of directory `path` in `sid`.
async fn names(c: &mut Client, sid: &str, path: &str, recursive: bool) -> Vec<String> {
    let out = ok(
        c,
        sid,
        "list_directory",
        json!({"path": path, "recursive": recursive, "includeHidden": true}),
    )
    .await;
    out["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap().to_string())
        .collect()
}

pub const ALL: pb::ApprovalMode = pb::ApprovalMode::All;
pub const SAFE: pb::ApprovalMode = pb::ApprovalMode::Safe;
pub const NONE: pb::ApprovalMode = pb::ApprovalMode::None;
pub const UNSPECIFIED: pb::ApprovalMode = pb::ApprovalMode::Unspecified;

// ---------------------------------------------------------------- 1. lifecycle

/// Create (generated and given ids, the server's defaults, bad and taken ids), get, list,
/// close; a closed or unknown session is SESSION_NOT_FOUND for every call and never made.
pub async fn lifecycle_create_get_list_close(c: &mut Client, p: &dyn Probe) {
    // Generated id: s- and 128 random bits; the server's defaults.
    let s = create(c, "", UNSPECIFIED, 0).await.unwrap();
    assert!(is_generated_id(&s.session_id), "{}", s.session_id);
    assert_eq!(s.approval_mode, SAFE as i32);
    assert_eq!(s.idle_timeout_seconds, 1800);
    assert_eq!(s.workspace_path, "/workspace");
    assert_size(&s);
    assert!(s.workspace_files_limit > 0, "{s:?}");
    assert!(s.expires_at_ms > s.created_at_ms);
    let other = create(c, "", UNSPECIFIED, 0).await.unwrap();
    assert!(is_generated_id(&other.session_id));
    assert_ne!(other.session_id, s.session_id);

    // A given id, kept; its mode and idle timeout as asked.
    let id = unique("my-sess_");
    let mine = create(c, &id, ALL, 60).await.unwrap();
    assert_eq!(mine.session_id, id);
    assert_eq!(mine.approval_mode, ALL as i32);
    assert_eq!(mine.idle_timeout_seconds, 60);
    for bad in ["../x", "a/b", "a b", ".hidden", &"x".repeat(65)] {
        let e = create(c, bad, ALL, 0).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{bad:?}: {e:?}");
    }
    let e = create(c, &id, ALL, 0).await.unwrap_err();
    assert_eq!(e.code(), Code::AlreadyExists, "{e:?}");

    // Get and List.
    let got = get(c, &id).await.unwrap();
    assert_eq!(got.session_id, id);
    assert_eq!(got.approval_mode, ALL as i32);
    let listed = listed_ids(c).await;
    for sid in [&s.session_id, &other.session_id, &mine.session_id] {
        assert!(listed.contains(sid), "{sid} not in {listed:?}");
    }

    // The workspace holds what is written, and GetSession reports what it takes: 1 MiB
    // written by a program (random bytes: nothing compresses them away) is 1 MiB more used.
    let empty = get(c, &id).await.unwrap();
    write(c, &id, "a.txt", "hi").await;
    p.assert_open(&id);
    assert_eq!(content(c, &id, "a.txt").await, "     1\thi\n");
    shell(c, &id, "head -c 1048576 /dev/urandom > big.bin").await;
    let used = get(c, &id).await.unwrap();
    assert_size(&used);
    assert!(
        used.workspace_bytes_used >= empty.workspace_bytes_used + (1 << 20),
        "1 MiB written: {empty:?} then {used:?}"
    );
    assert!(
        used.workspace_bytes_used <= used.workspace_bytes_limit,
        "{used:?}"
    );
    assert!(
        used.workspace_files_used >= empty.workspace_files_used + 2,
        "two files: {empty:?} then {used:?}"
    );
    assert!(
        used.workspace_files_used <= used.workspace_files_limit,
        "{used:?}"
    );
    // ListSessions reports it too.
    let listed = within("ListSessions", c.list_sessions(pb::ListSessionsRequest {}))
        .await
        .unwrap()
        .into_inner()
        .sessions;
    let mine_listed = listed.iter().find(|s| s.session_id == id).unwrap();
    assert!(
        mine_listed.workspace_bytes_used >= empty.workspace_bytes_used + (1 << 20),
        "{mine_listed:?}"
    );
    assert_eq!(
        mine_listed.workspace_bytes_limit,
        used.workspace_bytes_limit
    );

    // Close: gone everywhere.
    let closed = close(c, &id).await.unwrap();
    assert_eq!(closed.session.unwrap().session_id, id);
    assert_eq!(closed.calls_cancelled, 0);
    assert_eq!(get(c, &id).await.unwrap_err().code(), Code::NotFound);
    let (r, _) = call(c, &id, "read_file", json!({"path": "a.txt"})).await;
    assert_code(&r, "SESSION_NOT_FOUND", "read_file in a closed session");
    assert_gone(p, &id);
    assert_eq!(close(c, &id).await.unwrap_err().code(), Code::NotFound);
    let listed = listed_ids(c).await;
    assert!(!listed.contains(&id), "{listed:?}");

    // An unknown id is never created silently.
    let unknown = unique("no-such-session-");
    let (r, _) = call(
        c,
        &unknown,
        "write_file",
        json!({"path": "x", "content": ""}),
    )
    .await;
    assert_code(&r, "SESSION_NOT_FOUND", "write_file in an unknown session");
    let (r, _) = call(c, &unknown, "shell", json!({"command": "true"})).await;
    assert_code(&r, "SESSION_NOT_FOUND", "shell in an unknown session");
    let (r, _) = call_req(
        c,
        req(
            &unknown,
            "run_code",
            &json!({"language": "python", "code": "print(1)"}),
            0,
        ),
    )
    .await;
    assert_code(&r, "SESSION_NOT_FOUND", "run_code in an unknown session");
    assert_eq!(get(c, &unknown).await.unwrap_err().code(), Code::NotFound);
    assert_gone(p, &unknown);
    close_all(c, &[&s.session_id, &other.session_id]).await;
}

/// Asserts GetSession reports the configured workspace size as the limit (less the
/// filesystem's overhead, see [`FS_OVERHEAD`]).
fn assert_size(s: &pb::Session) {
    assert!(
        (WORKSPACE_SIZE - FS_OVERHEAD..=WORKSPACE_SIZE).contains(&s.workspace_bytes_limit),
        "the limit is not the configured {WORKSPACE_SIZE} bytes: {s:?}"
    );
}

// ---------------------------------------------------------------- 2. file tools

/// Every file tool's results and typed errors, seen through the file tools themselves.
pub async fn every_file_tool_over_grpc(c: &mut Client, _p: &dyn Probe) {
    let s = session(c, ALL).await;

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
    let (r, _) = call(
        c,
        &s,
        "write_file",
        json!({"path": "nodir/x.txt", "content": "x"}),
    )
    .await;
    assert!(!r.ok, "{r:?}");
    assert!(
        !names(c, &s, ".", false)
            .await
            .contains(&"nodir".to_string())
    );
    ok(
        c,
        &s,
        "write_file",
        json!({"path": "/workspace/d2/b.txt", "content": "bee\n", "createDirs": true}),
    )
    .await;
    assert_eq!(content(c, &s, "d2/b.txt").await, "     1\tbee\n");
    // DESIGN.md "Session tool arguments": seed 001's `createDirectories` accepted too.
    ok(
        c,
        &s,
        "write_file",
        json!({"path": "/workspace/d3/c.txt", "content": "sea\n", "createDirectories": true}),
    )
    .await;
    assert_eq!(content(c, &s, "d3/c.txt").await, "     1\tsea\n");

    // read_file: numbered lines as cat -n, offset/limit in lines.
    let out = ok(
        c,
        &s,
        "read_file",
        json!({"path": "dir/sub/a.txt", "offset": 2, "limit": 2}),
    )
    .await;
    assert_eq!(out["content"], "     2\ttwo\n     3\tthree\n", "{out}");
    assert_eq!(out["size"], 19);
    assert_eq!(out["binary"], false);
    let out = ok(
        c,
        &s,
        "read_file",
        json!({"path": "/workspace/dir/sub/a.txt"}),
    )
    .await;
    assert_eq!(
        out["content"], "     1\tone\n     2\ttwo\n     3\tthree\n     4\tfour\n",
        "{out}"
    );
    assert_missing(c, &s, "missing.txt").await;
    for bad in ["../x", "/etc/passwd", "a\u{0}b", "dir/../../x"] {
        let (r, _) = call(c, &s, "read_file", json!({ "path": bad })).await;
        assert_code(&r, "INVALID_PATH", &format!("read_file {bad:?}"));
    }

    // list_directory, recursive and not.
    let all = names(c, &s, ".", true).await;
    assert!(
        all.iter().any(|n| n.ends_with("a.txt")) && all.iter().any(|n| n.ends_with("b.txt")),
        "{all:?}"
    );
    let out = ok(c, &s, "list_directory", json!({"path": "dir/sub"})).await;
    assert_eq!(out["entries"][0]["name"], "a.txt", "{out}");
    assert_eq!(out["entries"][0]["type"], "file", "{out}");
    assert_eq!(out["entries"][0]["size"], 19, "{out}");

    // glob: newest first (the older file's mtime set back by a program).
    ok(
        c,
        &s,
        "write_file",
        json!({"path": "g/old.rs", "content": "1", "createDirs": true}),
    )
    .await;
    shell(c, &s, "touch -d 2000-01-01 g/old.rs").await;
    write(c, &s, "g/new.rs", "2").await;
    let out = ok(c, &s, "glob", json!({"pattern": "**/*.rs"})).await;
    assert_eq!(out["files"], json!(["g/new.rs", "g/old.rs"]), "{out}");
    let out = ok(
        c,
        &s,
        "glob",
        json!({"pattern": "*.txt", "path": "dir/sub"}),
    )
    .await;
    assert_eq!(out["count"], 1, "{out}");

    // edit: no match, several matches, success (with the change shown).
    write(c, &s, "e.txt", "x = 1\ny = 1\n").await;
    let (r, _) = call(
        c,
        &s,
        "edit",
        json!({"path": "e.txt", "old_string": "z = 1", "new_string": "z = 2"}),
    )
    .await;
    assert_code(&r, "NO_MATCH", "edit of absent text");
    let (r, _) = call(
        c,
        &s,
        "edit",
        json!({"path": "e.txt", "old_string": "= 1", "new_string": "= 2"}),
    )
    .await;
    assert_code(&r, "AMBIGUOUS_MATCH", "edit of text found twice");
    assert!(message(&r).contains('2'), "says how many: {r:?}");
    let out = ok(
        c,
        &s,
        "edit",
        json!({"path": "e.txt", "old_string": "y = 1", "new_string": "y = 2"}),
    )
    .await;
    assert_eq!(out["replacements"], 1, "{out}");
    assert!(out["diff"].as_str().unwrap().contains("+y = 2"), "{out}");
    assert_eq!(
        content(c, &s, "e.txt").await,
        "     1\tx = 1\n     2\ty = 2\n"
    );
    let out = ok(
        c,
        &s,
        "edit",
        json!({"path": "e.txt", "old_string": "= ", "new_string": ":= ", "replace_all": true}),
    )
    .await;
    assert_eq!(out["replacements"], 2, "{out}");

    // move_file: refused over an existing file unless overwrite.
    write(c, &s, "m1.txt", "m1").await;
    write(c, &s, "m2.txt", "m2").await;
    let (r, _) = call(
        c,
        &s,
        "move_file",
        json!({"from": "m1.txt", "to": "m2.txt"}),
    )
    .await;
    assert_code(&r, "ALREADY_EXISTS", "move over an existing file");
    assert_eq!(content(c, &s, "m2.txt").await, "     1\tm2\n");
    let out = ok(
        c,
        &s,
        "move_file",
        json!({"from": "m1.txt", "to": "m2.txt", "overwrite": true}),
    )
    .await;
    assert_eq!(out["overwritten"], true, "{out}");
    assert_eq!(content(c, &s, "m2.txt").await, "     1\tm1\n");
    assert_missing(c, &s, "m1.txt").await;
    ok(
        c,
        &s,
        "move_file",
        json!({"from": "m2.txt", "to": "dir/m3.txt"}),
    )
    .await;
    assert_eq!(content(c, &s, "dir/m3.txt").await, "     1\tm1\n");

    // delete_file: a directory needs recursive.
    let (r, _) = call(c, &s, "delete_file", json!({"path": "dir"})).await;
    assert!(!r.ok, "{r:?}");
    assert_eq!(content(c, &s, "dir/sub/a.txt").await.lines().count(), 4);
    let out = ok(
        c,
        &s,
        "delete_file",
        json!({"path": "dir", "recursive": true}),
    )
    .await;
    assert!(out["count"].as_u64().unwrap() >= 3, "{out}");
    assert_missing(c, &s, "dir/sub/a.txt").await;
    assert!(!names(c, &s, ".", false).await.contains(&"dir".to_string()));
    ok(c, &s, "delete_file", json!({"path": "e.txt"})).await;
    assert_missing(c, &s, "e.txt").await;

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
        (
            "edit",
            json!({"path": "a", "old_string": "x", "new_string": "y"}),
        ),
        ("shell", json!({"command": "true"})),
    ] {
        let (r, _) = call(c, "", tool, args).await;
        assert_code(
            &r,
            "INVALID_ARGUMENTS",
            &format!("{tool} without a session"),
        );
        assert!(message(&r).contains("session"), "{tool}: {r:?}");
    }
    close_all(c, &[&s]).await;
}

/// grep: `path:line: text`, case, glob, maxResults, binary files skipped, bad patterns and
/// paths refused.
pub async fn grep_over_grpc(c: &mut Client, _p: &dyn Probe) {
    let s = session(c, ALL).await;
    ok(
        c,
        &s,
        "write_file",
        json!({"path": "dir/sub/a.txt", "content": "one\ntwo\nthree\nfour\n", "createDirs": true}),
    )
    .await;
    ok(
        c,
        &s,
        "write_file",
        json!({"path": "d2/b.txt", "content": "bee\n", "createDirs": true}),
    )
    .await;
    // A binary file that matches is skipped, never dumped.
    ok(
        c,
        &s,
        "write_file",
        json!({"path": "bin.dat", "content": "dHdvAAB0d28K", "encoding": "base64"}),
    )
    .await;

    let out = ok(c, &s, "grep", json!({"pattern": "t[wh]", "path": "."})).await;
    let rendered = out["rendered"].as_str().unwrap();
    assert_eq!(
        rendered, "dir/sub/a.txt:2: two\ndir/sub/a.txt:3: three\n",
        "{out}"
    );
    assert_eq!(out["matchCount"], 2, "{out}");
    assert_eq!(out["matches"][0]["path"], "dir/sub/a.txt", "{out}");
    assert_eq!(out["matches"][0]["line"], 2, "{out}");
    assert_eq!(out["binaryFilesSkipped"], 1, "{out}");
    let out = ok(
        c,
        &s,
        "grep",
        json!({"pattern": "BEE", "caseInsensitive": true, "glob": "*.txt"}),
    )
    .await;
    assert_eq!(out["rendered"], "d2/b.txt:1: bee\n", "{out}");
    let out = ok(
        c,
        &s,
        "grep",
        json!({"pattern": "e", "path": "dir", "maxResults": 1}),
    )
    .await;
    assert_eq!(out["matchCount"], 1, "{out}");
    assert_eq!(out["truncated"], true, "{out}");
    let (r, _) = call(c, &s, "grep", json!({"pattern": "(", "path": "."})).await;
    assert!(!r.ok, "{r:?}");
    let (r, _) = call(c, &s, "grep", json!({"pattern": "x", "path": "../.."})).await;
    assert_code(&r, "INVALID_PATH", "grep outside the workspace");
    close_all(c, &[&s]).await;
}

// ---------------------------------------------------------------- 3. programs and files

/// Programs (shell, run_code with a session) and the file tools see the same files, in
/// `/workspace`, the programs' working directory; run_code without a session sees none.
pub async fn programs_and_file_tools_see_the_same_files(c: &mut Client, _p: &dyn Probe) {
    let s = session(c, ALL).await;

    write(c, &s, "from-tool.txt", "written by write_file\n").await;
    let out = shell(c, &s, "cat from-tool.txt && pwd").await;
    assert_eq!(
        out["stdout"], "written by write_file\n/workspace\n",
        "{out}"
    );

    shell(
        c,
        &s,
        "mkdir -p sub && printf 'from shell\\n' > sub/from-shell.txt",
    )
    .await;
    assert_eq!(
        content(c, &s, "sub/from-shell.txt").await,
        "     1\tfrom shell\n"
    );
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
        req(
            &s,
            "run_code",
            &json!({"language": "python", "code": code}),
            0,
        ),
    )
    .await;
    assert!(r.ok, "{r:?}");
    assert_eq!(
        out["stdout"], "/workspace\nwritten by write_file\n",
        "{out}"
    );
    assert_eq!(content(c, &s, "from-py.txt").await, "     1\tpy\n");
    let out = shell(c, &s, "cat from-py.txt").await;
    assert_eq!(out["stdout"], "py", "{out}");

    // run_code without a session stays stateless: no /workspace, none of its files.
    let code = "import os\nprint(os.getcwd())\nprint(os.path.exists('/workspace'))\nprint(os.path.exists('from-tool.txt'))\n";
    let (r, out) = call_req(
        c,
        req(
            "",
            "run_code",
            &json!({"language": "python", "code": code}),
            0,
        ),
    )
    .await;
    assert!(r.ok, "{r:?}");
    let stdout = out["stdout"].as_str().unwrap();
    assert!(stdout.ends_with("False\nFalse\n"), "{out}");
    assert_ne!(stdout.lines().next(), Some("/workspace"), "{out}");
    close_all(c, &[&s]).await;
}

// ---------------------------------------------------------------- 4. shell

/// A shell past its timeout: TIMEOUT with the output so far, every process of it gone, and
/// the session still works.
pub async fn shell_timeout_returns_partial_output_and_the_session_survives(
    c: &mut Client,
    p: &dyn Probe,
) {
    let s = session(c, ALL).await;
    let marker = unique("shto");
    let cmd =
        format!("echo started; M={marker}; (exec -a $M-bg sleep 100) & exec -a $M-fg sleep 100");
    let t0 = Instant::now();
    let (r, out) = call(c, &s, "shell", json!({"command": cmd, "timeout": 2000})).await;
    let took = t0.elapsed();
    assert_code(&r, "TIMEOUT", "shell past its timeout");
    assert_eq!(out["stdout"], "started\n", "{out}");
    assert_eq!(out["timed_out"], true, "{out}");
    assert!(took >= Duration::from_millis(1900), "took {took:?}");
    assert!(took < Duration::from_secs(60), "took {took:?}");
    wait_no_process(p, &marker).await;
    // The session still works.
    let out = shell(c, &s, "echo again > after.txt && cat after.txt").await;
    assert_eq!(out["stdout"], "again\n");
    assert_eq!(content(c, &s, "after.txt").await, "     1\tagain\n");
    close_all(c, &[&s]).await;
}

/// StreamTool of a shell: its output arrives while it runs (the second line waits for a
/// file the test writes only after it saw the first).
pub async fn shell_streams_output_live(c: &mut Client, _p: &dyn Probe) {
    let s = session(c, ALL).await;
    let cmd = "echo first; while [ ! -e go ]; do sleep 0.05; done; echo second";
    let mut st = stream(
        c,
        req(&s, "shell", &json!({"command": cmd, "timeout": 60000}), 0),
    )
    .await;
    expect_stdout(&mut st, "first\n").await;
    write(c, &s, "go", "").await;
    let (rest, r) = stream_result(&mut st).await;
    assert!(r.ok, "{r:?}");
    assert_eq!(rest, "second\n");
    let out = output(&r);
    assert_eq!(out["stdout"], "first\nsecond\n");
    close_all(c, &[&s]).await;
}

/// CloseSession while a shell runs: the call ends CANCELLED, is counted, and none of its
/// processes survives.
pub async fn close_session_cancels_a_running_shell(c: &mut Client, p: &dyn Probe) {
    let s = session(c, ALL).await;
    let marker = unique("shcl");
    let cmd = format!(
        "M={marker}; (exec -a $M-bg sleep 1000) & setsid bash -c \"exec -a $M-sid sleep 1000\" & echo ready; exec -a $M-fg sleep 1000"
    );
    let mut st = stream(
        c,
        req(&s, "shell", &json!({"command": cmd, "timeout": 300000}), 0),
    )
    .await;
    expect_stdout(&mut st, "ready\n").await;
    // Every process of it exists before the close (else "none survives" is vacuous).
    for part in ["bg", "sid", "fg"] {
        wait_process(p, &format!("{marker}-{part}")).await;
    }
    let closed = close(c, &s).await.unwrap();
    assert_eq!(closed.calls_cancelled, 1, "{closed:?}");
    let (_, r) = stream_result(&mut st).await;
    assert_code(&r, "CANCELLED", "shell in a closed session");
    wait_no_process(p, &marker).await;
    assert_gone(p, &s);
    let (r, _) = call(c, &s, "shell", json!({"command": "true"})).await;
    assert_code(&r, "SESSION_NOT_FOUND", "shell in the closed session");
}

// ---------------------------------------------------------------- 5. approvals

/// Mode safe (the default): reads and new files run, destructive calls wait; a denial
/// carries its message, an approval runs the call, an approval is decided once; StreamTool
/// sends the approval first; overwrite, shell, edit and run_code ask with their kinds.
pub async fn approvals_deny_approve_and_decide_once(c: &mut Client, _p: &dyn Probe) {
    let s = session(c, UNSPECIFIED).await;
    assert_eq!(get(c, &s).await.unwrap().approval_mode, SAFE as i32);
    // A new file: no approval in mode safe; reads never ask.
    write(c, &s, "f.txt", "keep").await;
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
    assert_eq!(content(c, &s, "f.txt").await, "     1\tkeep\n");
    assert!(!pending.is_finished());
    let d = decide(c, &a.approval_id, false, "", "not now, please")
        .await
        .unwrap();
    assert!(!d.approved);
    let (r, _) = join(pending).await;
    assert_code(&r, "APPROVAL_DENIED", "denied delete");
    assert!(message(&r).contains("not now, please"), "{r:?}");
    assert_eq!(content(c, &s, "f.txt").await, "     1\tkeep\n");
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
    assert_eq!(content(c, &s, "f.txt").await, "     1\tkeep\n");
    let d = decide(c, &a.approval_id, true, "", "").await.unwrap();
    assert!(d.approved);
    let (_, r) = stream_result(&mut st).await;
    assert!(r.ok, "{r:?}");
    assert_missing(c, &s, "f.txt").await;
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
    write(c, &s, "w.txt", "old").await;
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
        assert_eq!(content(c, &s, "w.txt").await, "     1\told\n");
        decide(c, &a.approval_id, false, "", "no").await.unwrap();
        let (r, _) = join(pending).await;
        assert_code(&r, "APPROVAL_DENIED", tool);
        assert_eq!(content(c, &s, "w.txt").await, "     1\told\n");
    }
    close_all(c, &[&s, &other]).await;
}

/// No decision before the caller's deadline: APPROVAL_REQUIRED at the deadline, the
/// approval withdrawn, nothing ran.
pub async fn no_decision_before_the_caller_deadline_is_approval_required(
    c: &mut Client,
    _p: &dyn Probe,
) {
    let s = session(c, SAFE).await;
    write(c, &s, "f.txt", "keep").await;
    let t0 = Instant::now();
    let pending = spawn_call(c, req(&s, "delete_file", &json!({"path": "f.txt"}), 3000));
    let a = wait_approval(c, &s, &[]).await;
    let (r, _) = join(pending).await;
    let took = t0.elapsed();
    assert_code(&r, "APPROVAL_REQUIRED", "no decision within timeout_ms");
    assert!(
        took >= Duration::from_millis(2900) && took < Duration::from_secs(30),
        "took {took:?}"
    );
    assert!(
        approvals(c, &s).await.is_empty(),
        "the approval is withdrawn"
    );
    let e = decide(c, &a.approval_id, true, "", "").await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
    assert_eq!(content(c, &s, "f.txt").await, "     1\tkeep\n");
    close_all(c, &[&s]).await;
}

/// Approved with other arguments: the call runs with them and says so; arguments that
/// break the schema are refused (still pending); arguments pointing outside the workspace
/// are INVALID_PATH and change nothing (SECURITY-CASES.md 48).
pub async fn approved_with_modified_arguments(c: &mut Client, p: &dyn Probe) {
    let s = session(c, SAFE).await;
    write(c, &s, "e.txt", "hello world\n").await;

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
    assert_eq!(content(c, &s, "e.txt").await, "     1\thello world\n");
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
    assert_eq!(content(c, &s, "e.txt").await, "     1\thello moon\n");

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
        let what = format!("{tool} modified to {modified}");
        assert_code(&r, "INVALID_PATH", &what);
        assert!(approvals(c, &s).await.is_empty());
        p.assert_outside_unchanged(&what);
        assert_eq!(content(c, &s, "e.txt").await, "     1\thello moon\n");
    }
    close_all(c, &[&s]).await;
}

/// Mode none: every call asks, reads too; a new file approved with the path of an existing
/// one asks again (destructive) and runs only once that is approved; denied, nothing runs.
pub async fn mode_none_asks_everything_and_a_stronger_change_asks_again(
    c: &mut Client,
    _p: &dyn Probe,
) {
    let s = session(c, NONE).await;

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
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!pending.is_finished(), "ran before its decision");
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

    // A new file, approved with a path that exists: a second approval (destructive), and
    // the call runs only once that one is approved (case 48).
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
    let held = [first.approval_id.clone(), second.approval_id.clone()];
    let (r, out) = approved_read(c, &s, "existing.txt", &held).await;
    assert!(r.ok, "{r:?}");
    assert_eq!(out["content"], "     1\toriginal\n", "{out}");
    let (r, _) = approved_read(c, &s, "new.txt", &held).await;
    assert_code(&r, "FILE_NOT_FOUND", "new.txt before the second approval");
    // The first approval cannot be decided again.
    let e = decide(c, &first.approval_id, true, "", "")
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
    decide(c, &second.approval_id, true, "", "").await.unwrap();
    let (r, out) = join(pending).await;
    assert!(r.ok, "{r:?}");
    assert_eq!(out["approval"]["argumentsModified"], true, "{out}");
    let (_, out) = approved_read(c, &s, "existing.txt", &[]).await;
    assert_eq!(out["content"], "     1\tX\n", "{out}");
    let (r, _) = approved_read(c, &s, "new.txt", &[]).await;
    assert_code(&r, "FILE_NOT_FOUND", "new.txt after the modified write");

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
    let (_, out) = approved_read(c, &s, "existing.txt", &[]).await;
    assert_eq!(out["content"], "     1\tX\n", "{out}");
    close_all(c, &[&s]).await;
}

/// WatchApprovals streams a new approval; in mode all nothing asks, destructive calls
/// included.
pub async fn watch_approvals_streams_new_ones_and_mode_all_asks_nothing(
    c: &mut Client,
    _p: &dyn Probe,
) {
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
    write(c, &s, "f.txt", "x").await;
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
    assert_missing(c, &s, "f.txt").await;

    // Mode all: destructive calls run at once, nothing is asked.
    let all = session(c, ALL).await;
    write(c, &all, "f.txt", "x").await;
    write(c, &all, "f.txt", "y").await;
    ok(
        c,
        &all,
        "edit",
        json!({"path": "f.txt", "old_string": "y", "new_string": "z"}),
    )
    .await;
    assert_eq!(content(c, &all, "f.txt").await, "     1\tz\n");
    shell(c, &all, "true").await;
    ok(c, &all, "delete_file", json!({"path": "f.txt"})).await;
    assert_missing(c, &all, "f.txt").await;
    assert!(approvals(c, &all).await.is_empty());
    close_all(c, &[&s, &all]).await;
}

// ---------------------------------------------------------------- 6. security

/// Asserts session `b`'s workspace holds exactly its secret, unchanged.
async fn assert_b_untouched(c: &mut Client, b: &str, what: &str) {
    let out = ok(c, b, "read_file", json!({"path": "secret-B.txt"})).await;
    assert_eq!(
        out["content"], "     1\tB-secret\n",
        "{what}: B's file changed"
    );
    let files = names(c, b, ".", false).await;
    assert_eq!(
        files,
        ["secret-B.txt"],
        "{what}: B's workspace now holds {files:?}"
    );
}

/// SECURITY-CASES.md 40: symlinks a program made to files and directories outside its
/// workspace (the root, /etc, /proc/self/root, another session's workspace where the
/// backend has one on a shared filesystem) are refused by every file tool with
/// INVALID_PATH, walks never follow them, and nothing outside changes.
pub async fn case40_symlinks_out_of_the_workspace(c: &mut Client, p: &dyn Probe) {
    let a = session(c, ALL).await;
    let b = session(c, ALL).await;
    write(c, &b, "secret-B.txt", "B-secret").await;
    // Another session's workspace where there is one to point at; else another
    // directory and file outside the workspace.
    let (other_dir, other_file) = match p.workspace_dir(&b) {
        Some(d) => (
            d.display().to_string(),
            d.join("secret-B.txt").display().to_string(),
        ),
        None => ("/tmp".to_string(), "/etc/hostname".to_string()),
    };
    let links = format!(
        "ln -s /etc/passwd p && ln -s / root && ln -s /proc/self/root pr && \
         ln -s {other_dir} other && ln -s {other_file} otherf && ln -s /etc etc"
    );
    shell(
        c,
        &a,
        &format!("{links} && mkdir d && echo normal > normal.txt && echo normal > d/n.txt"),
    )
    .await;

    // Control: the same calls on normal files work.
    assert_eq!(content(c, &a, "normal.txt").await, "     1\tnormal\n");
    ok(c, &a, "list_directory", json!({"path": "d"})).await;
    ok(c, &a, "glob", json!({"pattern": "*.txt", "path": "d"})).await;

    for path in [
        "p",
        "root/etc/passwd",
        "pr/etc/passwd",
        "otherf",
        "other/secret-B.txt",
        "etc/passwd",
    ] {
        let (r, out) = call(c, &a, "read_file", json!({ "path": path })).await;
        assert_code(&r, "INVALID_PATH", &format!("read_file {path}"));
        assert!(!out.to_string().contains("root:") && !out.to_string().contains("B-secret"));
        for old in ["root", "B-secret"] {
            let (r, _) = call(
                c,
                &a,
                "edit",
                json!({"path": path, "old_string": old, "new_string": "toor"}),
            )
            .await;
            assert_code(&r, "INVALID_PATH", &format!("edit {path}"));
        }
        p.assert_outside_unchanged(&format!("edit {path}"));
    }
    assert_b_untouched(c, &b, "edits through links").await;
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
        assert_code(&r, "INVALID_PATH", &format!("delete_file {path}"));
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
        p.assert_outside_unchanged(path);
    }
    assert_b_untouched(c, &b, "writes through links").await;
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
    let listed = names(c, &a, ".", true).await.join(" ");
    assert!(
        !listed.contains("passwd") && !listed.contains("secret-B"),
        "{listed}"
    );

    // On the link itself: write_file replaces the link, delete_file and move_file act on
    // the link; the targets stay as they were.
    for (tool, args) in [
        ("write_file", json!({"path": "p", "content": "mine"})),
        ("write_file", json!({"path": "otherf", "content": "mine"})),
        ("move_file", json!({"from": "other", "to": "stolen"})),
    ] {
        let (r, _) = call(c, &a, tool, args.clone()).await;
        assert!(code(&r) == "INVALID_PATH" || r.ok, "{tool} {args}: {r:?}");
        p.assert_outside_unchanged(&format!("{tool} {args}"));
    }
    assert_b_untouched(c, &b, "writes on links").await;
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
        p.assert_outside_unchanged(&format!("delete_file {link}"));
    }
    assert_b_untouched(c, &b, "deletes of links").await;
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
        &format!("rm -f p root pr other otherf etc stolen && {links}"),
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
    close_all(c, &[&a, &b]).await;
}

/// SECURITY-CASES.md 41: a program swaps a directory for a symlink to /etc as fast as it
/// can while the file tools work on paths through it: they never read, list or change /etc.
pub async fn case41_a_directory_swapped_for_a_symlink_in_a_loop(c: &mut Client, p: &dyn Probe) {
    let s = session(c, ALL).await;
    ok(
        c,
        &s,
        "write_file",
        json!({"path": "d/passwd", "content": "inner\n", "createDirs": true}),
    )
    .await;
    // The loop ends when the test writes `stop` (the timeout is only a safety net).
    let cmd = "echo go; while [ ! -e stop ]; do mv d d.real; ln -s /etc d; rm d; mv d.real d; done";
    let mut st = stream(
        c,
        req(&s, "shell", &json!({"command": cmd, "timeout": 300000}), 0),
    )
    .await;
    expect_stdout(&mut st, "go\n").await;
    // At least 3 s and 6 rounds of calls while the loop runs.
    let t0 = Instant::now();
    let mut rounds = 0;
    while t0.elapsed() < Duration::from_secs(3) || rounds < 6 {
        assert!(t0.elapsed() < WAIT_BOUND, "only {rounds} rounds ran");
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
        rounds += 1;
    }
    write(c, &s, "stop", "").await;
    let (_, r) = stream_result(&mut st).await;
    assert!(r.ok, "the swapping loop: {r:?}");
    p.assert_outside_unchanged("the swapping loop");
    // /etc/passwd as the session's programs see it is unchanged too.
    let out = shell(c, &s, "grep -c '^root:' /etc/passwd").await;
    assert_eq!(out["stdout"], "1\n", "{out}");
    close_all(c, &[&s]).await;
}

/// A call that must answer within [`PROMPT`] (never block on what it finds).
async fn prompt(c: &mut Client, sid: &str, tool: &str, args: Value) -> (pb::ToolResult, Value) {
    let t0 = Instant::now();
    let what = format!("{tool} {args}");
    let answer = call(c, sid, tool, args).await;
    assert!(t0.elapsed() < PROMPT, "{what} took {:?}", t0.elapsed());
    answer
}

/// SECURITY-CASES.md 42: a FIFO is refused at once (PERMISSION_DENIED), never opened.
pub async fn case42_fifo_is_refused_at_once(c: &mut Client, _p: &dyn Probe) {
    let s = session(c, ALL).await;
    shell(
        c,
        &s,
        "mkfifo p && mkfifo sub_p && echo hit > t.txt && [ -p p ]",
    )
    .await;
    let (r, _) = prompt(c, &s, "read_file", json!({"path": "p"})).await;
    assert_code(&r, "PERMISSION_DENIED", "read_file of a FIFO");
    assert!(message(&r).contains("FIFO"), "{r:?}");
    let (r, out) = prompt(c, &s, "grep", json!({"pattern": "hit", "path": "p"})).await;
    assert!(
        code(&r) == "PERMISSION_DENIED" || (r.ok && out["matchCount"] == 0),
        "grep of a FIFO: {r:?}"
    );
    let edit = json!({"path": "p", "old_string": "a", "new_string": "b"});
    let (r, _) = prompt(c, &s, "edit", edit).await;
    assert_code(&r, "PERMISSION_DENIED", "edit of a FIFO");
    let (r, out) = prompt(c, &s, "grep", json!({"pattern": "hit", "path": "."})).await;
    assert!(r.ok, "{r:?}");
    assert_eq!(out["rendered"], "t.txt:1: hit\n", "{out}");
    close_all(c, &[&s]).await;
}

/// SECURITY-CASES.md 43: huge files answer within bounds: a 1.5-million-line file read at
/// its end and truncated when read whole, a 15 MB line cut, edits of them refused, grep
/// through them; where the backend shows the workspace, a sparse 1 TiB file read as binary.
pub async fn case43_huge_files_answer_within_bounds(c: &mut Client, p: &dyn Probe) {
    let s = session(c, ALL).await;
    // Programs may write 16 MiB per file (sandbox.limits.max_file_size_mb).
    shell(
        c,
        &s,
        "seq 1500000 > lines && head -c 15000000 /dev/zero | tr '\\0' a > long",
    )
    .await;
    let t0 = Instant::now();
    // A sparse 1 TiB file, made on the host side as another writer could.
    if let Some(dir) = p.workspace_dir(&s) {
        let sparse = dir.join("sparse");
        std::fs::File::create(&sparse)
            .unwrap()
            .set_len(1 << 40)
            .unwrap();
        std::os::unix::fs::chown(&sparse, Some(65534), Some(65534)).unwrap();
        let out = ok(c, &s, "read_file", json!({"path": "sparse"})).await;
        assert_eq!(out["binary"], true, "{out}");
        assert!(out["content"].as_str().unwrap().len() < 1 << 20);
        let (r, _) = call(
            c,
            &s,
            "edit",
            json!({"path": "sparse", "old_string": "a", "new_string": "b"}),
        )
        .await;
        assert!(!r.ok, "{r:?}");
    }
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
    let text = out.to_string();
    assert_eq!(
        out["lines_truncated"]
            .as_bool()
            .or(out["linesTruncated"].as_bool()),
        Some(true),
        "{}",
        &text[..300.min(text.len())]
    );
    assert!(out["content"].as_str().unwrap().len() < 1 << 20);
    let (r, _) = call(
        c,
        &s,
        "edit",
        json!({"path": "long", "old_string": "ab", "new_string": "b"}),
    )
    .await;
    assert!(!r.ok, "{r:?}");
    assert!(t0.elapsed() < WAIT_BOUND, "took {:?}", t0.elapsed());
    let out = ok(c, &s, "grep", json!({"pattern": "^1499999$", "path": "."})).await;
    assert_eq!(out["rendered"], "lines:1499999: 1499999\n", "{out}");
    close_all(c, &[&s]).await;
}

/// SECURITY-CASES.md 45 and 46: a hard link to a file outside cannot be made, and the file
/// tools refuse a hard-linked file; session A sees neither B's files nor B's processes, by
/// program or by file tool.
pub async fn case45_46_hard_links_and_other_sessions_are_out_of_reach(
    c: &mut Client,
    p: &dyn Probe,
) {
    let a = session(c, ALL).await;
    let b = session(c, ALL).await;

    // Case 45: a hard link to a file outside cannot be made.
    let (r, out) = call(c, &a, "shell", json!({"command": "ln /etc/hostname x"})).await;
    assert!(!r.ok, "{r:?}");
    let stderr = out["stderr"].as_str().unwrap();
    assert!(
        stderr.contains("Invalid cross-device link") || stderr.contains("Operation not permitted"),
        "{out}"
    );
    assert_missing(c, &a, "x").await;
    // Control: a hard link inside the workspace works.
    let out = shell(c, &a, "echo in > f && ln f g && cat g").await;
    assert_eq!(out["stdout"], "in\n", "{out}");
    // ...but the file tools refuse a hard-linked file (it may share its contents with one
    // outside).
    let (r, _) = call(c, &a, "read_file", json!({"path": "g"})).await;
    assert_code(&r, "PERMISSION_DENIED", "read_file of a hard-linked file");

    // Case 46: B leaves a file and a process; A sees neither.
    let file_tail = unique("t");
    let file = format!("marker-B-{file_tail}");
    let proc_marker = unique("procB");
    let cmd = format!("echo s > {file}; echo ready; exec -a {proc_marker}-$X sleep 600");
    let mut st = stream(
        c,
        req(
            &b,
            "shell",
            &json!({"command": format!("X=live; {cmd}"), "timeout": 300000}),
            0,
        ),
    )
    .await;
    expect_stdout(&mut st, "ready\n").await;
    let live = format!("{proc_marker}-live");
    wait_process(p, &live).await;
    assert_eq!(content(c, &b, &file).await, "     1\ts\n");
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
    let mut paths = vec![
        format!("../{b}/{file}"),
        format!("/workspace/../{b}/{file}"),
    ];
    if let Some(dir) = p.workspace_dir(&b) {
        paths.push(dir.join(&file).display().to_string());
    }
    for path in paths {
        let (r, _) = call(c, &a, "read_file", json!({ "path": path })).await;
        assert_code(&r, "INVALID_PATH", &format!("read_file {path}"));
    }
    assert_missing(c, &a, &file).await;
    let out = ok(c, &a, "glob", json!({"pattern": "**/marker-B-*"})).await;
    assert_eq!(out["count"], 0, "{out}");
    close(c, &b).await.unwrap();
    let (_, r) = stream_result(&mut st).await;
    assert_code(&r, "CANCELLED", "B's shell when B closes");
    wait_no_process(p, &proc_marker).await;
    close_all(c, &[&a]).await;
}

/// SECURITY-CASES.md 49: a session idle past its timeout expires and leaves nothing (not a
/// process a program left behind either); a session with a call running does not expire
/// under it.
pub async fn case49_an_expired_session_leaves_nothing(c: &mut Client, p: &dyn Probe) {
    let s = create(c, "", ALL, 2).await.unwrap();
    assert_eq!(s.idle_timeout_seconds, 2);
    let id = s.session_id;
    let marker = unique("exp");
    shell(
        c,
        &id,
        &format!("echo x > f; (exec -a {marker} sleep 1000 &); true"),
    )
    .await;
    write(c, &id, "g", "x").await;
    p.assert_open(&id);
    // A session with a call running does not expire under it.
    let keep = create(c, "", ALL, 2).await.unwrap().session_id;
    let mut st = stream(
        c,
        req(
            &keep,
            "shell",
            &json!({"command": "echo go; sleep 6; echo done", "timeout": 120000}),
            0,
        ),
    )
    .await;
    let end = Instant::now() + WAIT_BOUND;
    loop {
        match get(c, &id).await {
            Err(e) => {
                assert_eq!(e.code(), Code::NotFound, "{e:?}");
                break;
            }
            Ok(_) => {
                assert!(
                    Instant::now() < end,
                    "the session did not expire within {WAIT_BOUND:?}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    let (r, _) = call(c, &id, "read_file", json!({"path": "f"})).await;
    assert_code(&r, "SESSION_NOT_FOUND", "read_file in an expired session");
    wait_gone(p, &id).await;
    wait_no_process(p, &marker).await;
    // The busy session outlived its idle timeout and finished its call.
    let (stdout, r) = stream_result(&mut st).await;
    assert!(r.ok, "{r:?}");
    assert_eq!(stdout, "go\ndone\n", "streamed; the result: {r:?}");
    assert!(get(c, &keep).await.is_ok(), "expired while a call ran");
    close_all(c, &[&keep]).await;
}
